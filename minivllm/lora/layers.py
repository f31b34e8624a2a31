"""The LoRA delta on the decoder's linears, batched per adapter: each step the manager says
which rows of the flattened batch run which adapter (LoRAStep), and a LoRALinear adds each
adapter's (x[rows] @ A.T) @ B.T to the base output at those rows. Rows of no adapter (the
base model's requests, padding) get the base output alone. Weights are never merged.

Two ways, chosen per step: when the adapters' row counts are about even (decode steps of
a mixed batch) their rows are gathered into one [adapters, rows, in] tensor and two
batched matmuls (torch.bmm over the adapters' stacked A and B) do every adapter at once —
a few ops per linear whatever the number of adapters; otherwise (a long prefill of one
adapter beside a few decodes, where padding to the longest would waste work) one small
matmul pair per adapter. One adapter alone runs on all rows without a gather."""

from __future__ import annotations

import torch

from minivllm.lora.weights import LoRAWeights

# Batched when the padded rows (adapters x the most rows of one) are at most this many
# times the real ones.
MAX_PADDING = 1.5


class LoRAStep:
    """One step's rows per adapter, and the stacked weights of the batched path."""

    def __init__(self) -> None:
        self.all_rows: LoRAWeights | None = None  # one adapter has every row
        self.groups: list[tuple[torch.Tensor, LoRAWeights]] = []  # the per-adapter path
        # The batched path: rows gathered as [adapters, longest, in] (`gather`), the
        # padded result's real rows (`keep`) and where they go (`rows`).
        self.gather: torch.Tensor | None = None
        self.keep: torch.Tensor | None = None
        self.rows: torch.Tensor | None = None
        self.adapters: tuple[LoRAWeights, ...] = ()
        # (layer, linear) -> A stacked [adapters, in, rank], B [adapters, rank, out], for
        # `adapters` (kept while the step's adapter set stays the same)
        self.stacks: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor] | None] = {}

    def stacked(self, key: tuple[int, str]) -> tuple[torch.Tensor, torch.Tensor] | None:
        if key not in self.stacks:
            pairs = [w.pairs.get(key) for w in self.adapters]
            present = next((p for p in pairs if p is not None), None)
            if present is None:
                self.stacks[key] = None
            else:
                rank = max(p[0].shape[0] for p in pairs if p is not None)
                a = present[0].new_zeros(len(pairs), present[0].shape[1], rank)
                b = present[1].new_zeros(len(pairs), rank, present[1].shape[0])
                for i, p in enumerate(pairs):
                    if p is not None:  # zero A and B: no delta for this adapter here
                        a[i, :, :p[0].shape[0]] = p[0].t()
                        b[i, :p[1].shape[1]] = p[1].t()
                self.stacks[key] = (a, b)
        return self.stacks[key]


class LoRALinear:
    """A decoder linear with the step's LoRA deltas added; called as the base linear is."""

    def __init__(self, base, layer: int, name: str, step: LoRAStep) -> None:
        self.base, self.key, self.step = base, (layer, name), step

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        y = self.base(x) if residual is None else self.base(x, residual=residual)
        step = self.step
        if step.all_rows is not None:
            pair = step.all_rows.pairs.get(self.key)
            if pair is not None:  # padding rows too: nothing reads them
                y.addmm_(x @ pair[0].t(), pair[1].t())
        elif step.gather is not None:
            stacks = step.stacked(self.key)
            if stacks is not None:
                n, longest = step.gather.shape
                xs = x.index_select(0, step.gather.flatten()).view(n, longest, -1)
                delta = torch.bmm(torch.bmm(xs, stacks[0]), stacks[1]).flatten(0, 1)
                if step.keep is not None:
                    delta = delta.index_select(0, step.keep)
                y.index_add_(0, step.rows, delta)
        else:
            for rows, adapter in step.groups:
                pair = adapter.pairs.get(self.key)
                if pair is not None:
                    y.index_add_(0, rows, (x.index_select(0, rows) @ pair[0].t()) @ pair[1].t())
        return y


def install(model: torch.nn.Module, step: LoRAStep) -> set[int]:
    """Wrap every decoder layer's linears (models/decoder.py's names, weights.FUSED's keys)
    in LoRALinears that read `step`. Returns the layers whose MLP is a plain gated MLP (LoRA
    on experts is not supported)."""
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
