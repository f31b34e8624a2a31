"""The LoRA delta on the decoder's linears, batched per adapter: each step the manager says
which rows of the flattened batch run which adapter (LoRAStep); a LoRALinear adds, for each
adapter in the step, (x[rows] @ A.T) @ B.T to the base output at those rows — one small
matmul pair per adapter, whatever the number of its requests. Rows of no adapter (the base
model's requests, padding) get the base output alone. Weights are never merged."""

from __future__ import annotations

import torch

from minivllm.lora.weights import LoRAWeights


class LoRAStep:
    """The step's adapters: (row indices, the adapter's weights), one entry per adapter;
    `all_rows` when one adapter has every row (no gather, no scatter)."""

    def __init__(self) -> None:
        self.groups: list[tuple[torch.Tensor, LoRAWeights]] = []
        self.all_rows: LoRAWeights | None = None


class LoRALinear:
    """A decoder linear with the step's LoRA deltas added; called as the base linear is."""

    def __init__(self, base, layer: int, name: str, step: LoRAStep) -> None:
        self.base, self.key, self.step = base, (layer, name), step

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        y = self.base(x) if residual is None else self.base(x, residual=residual)
        if self.step.all_rows is not None:
            pair = self.step.all_rows.pairs.get(self.key)
            if pair is not None:  # padding rows too: nothing reads them
                y.addmm_(x @ pair[0].t(), pair[1].t())
            return y
        for rows, adapter in self.step.groups:
            pair = adapter.pairs.get(self.key)
            if pair is not None:
                y.index_add_(0, rows, (x.index_select(0, rows) @ pair[0].t()) @ pair[1].t())
        return y


def install(model: torch.nn.Module, step: LoRAStep) -> set[int]:
    """Wrap every decoder layer's linears (models/decoder.py's names, weights.FUSED's keys)
    in LoRALinears that
    read `step`. Returns the layers whose MLP is a plain gated MLP (LoRA on experts is not
    supported)."""
    dense = set()
    for index, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv = LoRALinear(attn.qkv, index, "qkv", step)
        layer.o_proj = LoRALinear(layer.o_proj, index, "o_proj", step)
        if hasattr(mlp, "gate_up"):
            dense.add(index)
            mlp.gate_up = LoRALinear(mlp.gate_up, index, "gate_up", step)
            mlp.down = LoRALinear(mlp.down, index, "down", step)
    return dense
