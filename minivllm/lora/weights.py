"""An adapter's tensors, shaped for the decoder's fused linears: q/k/v run as one matmul
and gate/up as one (models/decoder.py). For a fused linear of projections p1..pk (a slot
each): A = [A_p1; ...; A_pk] ([k r, in], zeros for a projection the adapter leaves alone),
so one product x @ A.T gives every slot's r columns at once; then each slot's B ([out_pj, r],
scaled) adds its columns' product to its own slice of the output (LoRAPair)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from safetensors.torch import load_file

from minivllm.lora.peft_format import AdapterSpec, check_shapes, projection_shapes

# The decoder's linears (models/decoder.py) and the projections each one fuses.
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",),
         "gate_up": ("gate_proj", "up_proj"), "down": ("down_proj",)}


@dataclass
class LoRAPair:
    """One fused linear's LoRA: A [slots r, in], and per slot its B [out, r] (scaled; None
    where the adapter leaves that projection alone) and its output columns' offset."""

    a: torch.Tensor
    b: list[torch.Tensor | None]
    offsets: list[int]

    @property
    def rank(self) -> int:
        return self.a.shape[0] // len(self.b)


class LoRAWeights:
    """(layer, fused linear) -> its LoRAPair."""

    def __init__(self, spec: AdapterSpec, cfg, dtype: torch.dtype, device: torch.device,
                 dense_mlp_layers: set[int]) -> None:
        """`dense_mlp_layers`: the layers whose MLP is a plain gated MLP (not experts)."""
        check_shapes(spec, cfg)
        shapes = projection_shapes(cfg)
        for layer, proj in spec.targets:
            if proj in FUSED["gate_up"] + FUSED["down"] and layer not in dense_mlp_layers:
                raise ValueError(f"LoRA adapter {str(spec.path)!r}: {proj} of layer {layer} "
                                 "targets a mixture-of-experts MLP, which is not supported")
        tensors = load_file(spec.weights_file)
        self.rank = spec.rank
        self.pairs: dict[tuple[int, str], LoRAPair] = {}
        for layer in sorted({layer for layer, _ in spec.targets}):
            for fused, projections in FUSED.items():
                present = [(tensors[spec.targets[(layer, p)][0]],
                            tensors[spec.targets[(layer, p)][1]], p)
                           for p in projections if (layer, p) in spec.targets]
                if present:
                    self.pairs[(layer, fused)] = self._fuse(
                        present, [shapes[p][1] for p in projections], projections,
                        spec.scaling, dtype, device)

    @staticmethod
    def _fuse(present: list, out_sizes: list[int], projections: tuple[str, ...],
              scaling: float, dtype: torch.dtype, device: torch.device) -> LoRAPair:
        """present: (A, B, projection) of the targeted projections, in the linear's order."""
        rank, width = present[0][0].shape
        a = torch.zeros(rank * len(projections), width, dtype=dtype, device=device)
        b: list[torch.Tensor | None] = [None] * len(projections)
        for a_p, b_p, proj in present:
            slot = projections.index(proj)
            a[slot * rank:(slot + 1) * rank] = a_p.to(device, dtype)
            b[slot] = (b_p.to(device, torch.float32) * scaling).to(dtype).contiguous()
        offsets = [sum(out_sizes[:i]) for i in range(len(out_sizes))]
        return LoRAPair(a, b, offsets)
