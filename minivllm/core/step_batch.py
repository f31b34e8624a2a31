"""What a step holds, in the terms a cost model prices: the prefill chunks (their new tokens
and the context each reads), the decodes (one new token each, and the context each reads),
the KV swapped between device and host, and the disk tier's block transfers. The
simulator's cost models (sim/cost_model.py), `minivllm sim calibrate` and the scheduler's
own step-time model (core/step_cost.py) share this one vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from minivllm.core.scheduler_output import SchedulerOutput


@dataclass
class StepBatch:
    num_prefill_seqs: int = 0
    num_prefill_tokens: int = 0
    # Query-key pairs of the prefill chunks (causal): a chunk of n new tokens after c cached
    # ones attends n * c + n * (n + 1) / 2 pairs.
    prefill_attention: int = 0
    prefill_context: int = 0  # cached tokens the prefill chunks read (their KV), summed
    num_decode_seqs: int = 0
    decode_context: int = 0  # tokens each decode attends to (its KV read), summed
    num_swap_tokens: int = 0  # token slots of the KV blocks swapped out plus in
    # Token slots of the blocks the prefix cache's disk tier loads and writes: set by who
    # moves them (the simulator's replica: a block already on disk is not written again).
    num_disk_load_tokens: int = 0
    num_disk_write_tokens: int = 0
    # LoRA: new tokens of requests that run an adapter, and the distinct adapters
    num_lora_tokens: int = 0
    num_loras: int = 0
    # Requests whose last token is computed this step, so the LM head and the sampler run
    # on their row: every decode, and a prefill chunk that ends its prompt (set by
    # step_batch; 0 in a batch built from the aggregates alone).
    num_sampled_seqs: int = 0
    # Each prefill chunk's (new tokens, cached context), for a cost model that prices the
    # chunks one by one (sim/operators_model.py): the aggregates above cannot tell one chunk
    # of 200 tokens from two of 100. add() records them.
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    def add(self, num_new: int, context: int) -> None:
        """A request computing num_new tokens after `context` computed ones. One new token
        is a decode (also the last prompt token of a request the prefix cache served)."""
        if num_new == 1:
            self.num_decode_seqs += 1
            self.decode_context += context + 1
        else:
            self.num_prefill_seqs += 1
            self.num_prefill_tokens += num_new
            self.prefill_attention += num_new * context + num_new * (num_new + 1) // 2
            self.prefill_context += context
            self.prefill_chunks.append((num_new, context))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def padded_rows(num_tokens: int) -> int:
    """The rows a step's forward computes where the model runner pads them to oneDNN's
    buckets (model/runner.py, model/linear/onednn.py): exact up to 16 rows, then multiples
    of 16 up to 64, then multiples of 64. A cost model of such an engine prices the padding
    rows too."""
    step = 1 if num_tokens <= 16 else 16 if num_tokens <= 64 else 64
    return -(-num_tokens // step) * step


def row_bucket(rows: int, num_buckets: int) -> int:
    """The power-of-two bucket a call of `rows` rows falls in (1, 2, 3-4, 5-8, ...), the
    last covering every larger count: the buckets the linears' kernel choice measures."""
    return min(max(rows - 1, 0).bit_length(), num_buckets - 1)


@dataclass(frozen=True)
class RowPadding:
    """Whether a step's rows are padded to padded_rows, per row bucket: only where a linear
    runs through oneDNN there (a layer whose measured choice runs its own panels at 129
    rows but oneDNN at 512 must not pad 129 rows to 192). pads: one flag per bucket, the
    last for every larger count; () never pads."""

    pads: tuple[bool, ...] = ()

    @classmethod
    def of(cls, flags: bool | list[bool] | tuple[bool, ...] | None) -> RowPadding:
        """From a profile's record: the flags per bucket, or one bool for every row count
        (profiles written before the buckets)."""
        if isinstance(flags, bool):
            return cls((flags,))
        return cls(tuple(bool(f) for f in flags or ()))

    @classmethod
    def union(cls, paddings: list[RowPadding]) -> RowPadding:
        """Pads where any of them pads (each's last flag extended to the longest)."""
        n = max((len(p.pads) for p in paddings), default=0)
        return cls(tuple(any(p.pads and p.pads[min(i, len(p.pads) - 1)] for p in paddings)
                         for i in range(n)))

    def rows(self, num_tokens: int) -> int:
        """The rows a step of num_tokens tokens computes."""
        if not self.pads or not self.pads[row_bucket(num_tokens, len(self.pads))]:
            return num_tokens
        return padded_rows(num_tokens)


def step_batch(out: SchedulerOutput, requests: dict, block_size: int) -> StepBatch:
    """The step's composition. `requests`: the scheduler's id -> Request, whose
    num_computed_tokens is still the count before this step."""
    b = StepBatch(num_swap_tokens=(len(out.swap_in) + len(out.swap_out)) * block_size)
    loras = set()
    for req_id, n in out.num_scheduled_tokens.items():
        request = requests[req_id]
        b.add(n, request.num_computed_tokens)
        if request.num_computed_tokens + n >= request.num_tokens:
            b.num_sampled_seqs += 1
        if lora_id := request.core_request.lora_int_id:
            loras.add(lora_id)
            b.num_lora_tokens += n
    b.num_loras = len(loras)
    return b
