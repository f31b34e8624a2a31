"""An adapter's tensors, shaped for the decoder's fused linears: q/k/v run as one matmul
and gate/up as one (models/decoder.py), so their LoRA pairs are fused the same way. For a
fused linear with targets t1..tk: A = [A_t1; ...; A_tk] ([k r, in]) and B block-diagonal
([out, k r], each B_t in its own rows and columns, scaled), so x @ A.T @ B.T is every
target's delta at once, in its own slice of the output."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from minivllm.lora.peft_format import AdapterSpec, check_shapes, projection_shapes

# The decoder's linears (models/decoder.py) and the projections each one fuses.
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",),
         "gate_up": ("gate_proj", "up_proj"), "down": ("down_proj",)}


class LoRAWeights:
    """(layer, fused linear) -> (A [k r, in], B [out, k r]) with the scaling folded into B."""

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
        self.pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
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
              scaling: float, dtype: torch.dtype, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """present: (A, B, projection) of the targeted projections, in the linear's order."""
        rank = present[0][0].shape[0]
        a = torch.cat([a for a, _, _ in present]).to(device, dtype)
        b = torch.zeros(sum(out_sizes), rank * len(present), dtype=dtype, device=device)
        offsets = dict(zip(projections, [sum(out_sizes[:i]) for i in range(len(out_sizes))]))
        sizes = dict(zip(projections, out_sizes))
        for i, (_, b_t, proj) in enumerate(present):
            rows = slice(offsets[proj], offsets[proj] + sizes[proj])
            b[rows, i * rank:(i + 1) * rank] = b_t.to(device, dtype) * scaling
        return a.contiguous(), b.contiguous()
