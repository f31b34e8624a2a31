"""The LoRA delta on the decoder's linears, batched per adapter: each step the manager says
which rows of the flattened batch run which adapter (LoRAStep), and a LoRALinear adds each
adapter's (x[rows] @ A.T) @ B.T to the base output at those rows. Rows of no adapter (the
base model's requests, padding) get the base output alone. Weights are never merged.

With the C kernels (fp32 activations on the CPU) every step's deltas are one call per
linear: lora_sgmv.c's segment GEMM over the step's rows grouped by adapter, shrink and expand
accumulating into the base output in place (no gather, padding or scatter), the adapters'
weights fp32 or, under --dtype bfloat16, bf16 as the base's are. Elsewhere two
ways, chosen per step: when the adapters' row counts are about even (decode steps of a mixed
batch) their rows are gathered into one [adapters, rows, in] tensor and two batched matmuls
(torch.bmm over the adapters' stacked A and B) do every adapter at once — a few ops per
linear whatever the number of adapters; otherwise (a long prefill of one adapter beside a
few decodes, where padding to the longest would waste work) one small matmul pair per
adapter; and one adapter alone on all rows without a gather."""

from __future__ import annotations

import torch

from minivllm.lora.weights import LoRAPair, LoRAWeights
from minivllm.model.kernels import lora_ops

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
        # (layer, linear) -> `adapters`' A stacked [adapters, in, slots rank] and each
        # slot's B [adapters, rank, out] (rank: the highest of theirs, zero-padded), or one
        # block-diagonal B when every slot is targeted; kept while the step's adapter set
        # stays the same.
        self.stacks: dict[tuple[int, str], tuple | None] = {}
        # The kernel's path: every adapter row in `adapters`' order (`rows`) and where each
        # adapter's rows start (`seg`, one more).
        self.segments: tuple[torch.Tensor, torch.Tensor] | None = None
        # (layer, linear) -> lora_sgmv.c's operands (_kernel_stack).
        self.kernel_stacks: dict[tuple[int, str], tuple | None] = {}

    def stacked(self, key: tuple[int, str]) -> tuple | None:
        if key not in self.stacks:
            pairs = [w.pairs.get(key) for w in self.adapters]
            self.stacks[key] = _stack(pairs) if any(pairs) else None
        return self.stacks[key]

    def kernel_stacked(self, key: tuple[int, str], out: int) -> tuple | None:
        if key not in self.kernel_stacks:  # not kept in `stacks` too: the kernel's alone
            pairs = [w.pairs.get(key) for w in self.adapters]
            self.kernel_stacks[key] = _kernel_stack(pairs, out) if any(pairs) else None
        return self.kernel_stacks[key]


def _kernel_stack(pairs: list[LoRAPair | None], out: int) -> tuple:
    """lora_sgmv.c's operands, in the adapters' own dtype: A [n, slots rank, in]; the
    block-diagonal B without its zeros, each slot's block side by side, [n, rank, out]
    (zeros where an adapter leaves a slot alone or has a lower rank); and the slots' column
    bounds (slots + 1, the last `out`)."""
    some = next(p for p in pairs if p is not None)
    slots, rank = len(some.b), max(p.rank for p in pairs if p is not None)
    a = some.a.new_zeros(len(pairs), slots * rank, some.a.shape[1])
    b = some.a.new_zeros(len(pairs), rank, out)
    for i, pair in enumerate(pairs):
        if pair is None:
            continue
        r = pair.rank
        for slot, b_slot in enumerate(pair.b):
            a[i, slot * rank:slot * rank + r] = pair.a[slot * r:(slot + 1) * r]
            if b_slot is not None:
                offset = pair.offsets[slot]
                b[i, :r, offset:offset + b_slot.shape[0]] = b_slot.t()
    return a, b, torch.tensor([*some.offsets, out], dtype=torch.int64)


def _stack(pairs: list[LoRAPair | None]) -> tuple:
    """(A [n, in, slots rank], [B of each slot: [n, rank, out] or None], the slots' output
    offsets, rank), or with every slot targeted (A, [one B: [n, slots rank, out]], [0],
    slots rank)."""
    some = next(p for p in pairs if p is not None)
    slots, rank = len(some.b), max(p.rank for p in pairs if p is not None)
    a = some.a.new_zeros(len(pairs), some.a.shape[1], slots * rank)
    bs: list[torch.Tensor | None] = [None] * slots
    for i, pair in enumerate(pairs):
        if pair is None:
            continue  # zeros: no delta for this adapter here
        r = pair.rank
        for slot, b in enumerate(pair.b):
            a[i, :, slot * rank:slot * rank + r] = pair.a[slot * r:(slot + 1) * r].t()
            if b is not None:
                if bs[slot] is None:
                    bs[slot] = b.new_zeros(len(pairs), rank, b.shape[0])
                bs[slot][i, :r] = b.t()
    if all(b is not None for b in bs) and len(bs) > 1:
        # Every slot targeted: one block-diagonal B over the whole output, so the expand is
        # one batched matmul (the zero blocks cost less than a matmul and a concat each).
        full = a.new_zeros(len(pairs), slots * rank, sum(b.shape[2] for b in bs))
        for slot, b in enumerate(bs):
            offset = some.offsets[slot]
            full[:, slot * rank:(slot + 1) * rank, offset:offset + b.shape[2]] = b
        return a, [full], [0], slots * rank
    return a, bs, some.offsets, rank


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
                h, r = x @ pair.a.t(), pair.rank
                for slot, b in enumerate(pair.b):
                    if b is not None:
                        y[:, pair.offsets[slot]:pair.offsets[slot] + b.shape[0]].addmm_(
                            h[:, slot * r:(slot + 1) * r], b.t())
        elif step.segments is not None:
            stacks = step.kernel_stacked(self.key, y.shape[1])
            if stacks is not None:
                lora_ops.lora_sgmv(x, y, *step.segments, *stacks)
        elif step.gather is not None:
            stacks = step.stacked(self.key)
            if stacks is not None:
                self._batched(x, y, *stacks)
        else:
            for rows, adapter in step.groups:
                pair = adapter.pairs.get(self.key)
                if pair is None:
                    continue
                h, r = x.index_select(0, rows) @ pair.a.t(), pair.rank
                for slot, b in enumerate(pair.b):
                    if b is not None:
                        y[:, pair.offsets[slot]:pair.offsets[slot] + b.shape[0]].index_add_(
                            0, rows, h[:, slot * r:(slot + 1) * r] @ b.t())
        return y

    def _batched(self, x: torch.Tensor, y: torch.Tensor, a: torch.Tensor,
                 bs: list[torch.Tensor | None], offsets: list[int], rank: int) -> None:
        step = self.step
        n, longest = step.gather.shape
        h = torch.bmm(x.index_select(0, step.gather.flatten()).view(n, longest, -1), a)
        for slot, b in enumerate(bs):
            if b is None:
                continue
            delta = torch.bmm(h[:, :, slot * rank:(slot + 1) * rank], b).flatten(0, 1)
            if step.keep is not None:
                delta = delta.index_select(0, step.keep)
            y[:, offsets[slot]:offsets[slot] + b.shape[2]].index_add_(0, step.rows, delta)


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
