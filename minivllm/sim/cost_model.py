"""The simulator's one question to a cost model: how long does this step take?

A step is described by its composition (StepBatch), computed from the SchedulerOutput the
scheduler emits, before the step's tokens are counted as computed: the prefill chunks (their
new tokens and the context each reads), the decodes (one new token each, and the context each
reads) and the KV swapped between device and host. `minivllm sim calibrate` describes
the real engine's steps with the same function, so a fitted profile and the simulator see one
vocabulary.

Cost models: `roofline:PRESET` (sim/roofline.py) and `profile:PATH` (sim/profile.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass

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

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def step_batch(out: SchedulerOutput, requests: dict, block_size: int) -> StepBatch:
    """The step's composition. `requests`: the scheduler's id -> Request, whose
    num_computed_tokens is still the count before this step. A step of one new token is a
    decode (also the last prompt token of a request the prefix cache served)."""
    b = StepBatch(num_swap_tokens=(len(out.swap_in) + len(out.swap_out)) * block_size)
    for req_id, n in out.num_scheduled_tokens.items():
        context = requests[req_id].num_computed_tokens
        if n == 1:
            b.num_decode_seqs += 1
            b.decode_context += context + 1
        else:
            b.num_prefill_seqs += 1
            b.num_prefill_tokens += n
            b.prefill_attention += n * context + n * (n + 1) // 2
            b.prefill_context += context
    return b


class CostModel(ABC):
    """Step time in seconds from a StepBatch; optionally a default KV capacity."""

    name = "abstract"

    @abstractmethod
    def step_time(self, batch: StepBatch) -> float:
        """Seconds the step takes on the modelled machine."""

    def num_kv_blocks(self, block_size: int) -> int | None:
        """How many KV blocks the modelled machine holds (None: the caller must say)."""
        return None

    def num_swap_blocks(self, block_size: int, swap_space_gib: float) -> int | None:
        """How many host blocks `swap_space_gib` holds (None: the caller must say)."""
        return None

    def max_model_len(self) -> int | None:
        """The modelled model's context (None: the caller must say)."""
        return None

    def describe(self) -> dict:
        """What a report records about the model."""
        return {"name": self.name}
