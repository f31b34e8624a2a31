"""The simulator's one question to a cost model: how long does this step take?

A step is described by its composition (core/step_batch.py's StepBatch), computed from the
SchedulerOutput the scheduler emits, before the step's tokens are counted as computed.
`minivllm sim calibrate` describes the real engine's steps with the same function, so a
fitted profile and the simulator see one vocabulary.

Cost models: `roofline:PRESET` (sim/roofline.py) and `profile:PATH` (sim/profile.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from minivllm.core.step_batch import StepBatch


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
