"""The simulator's one question to a cost model: how long does this step take?

A step is described by its composition (core/step_batch.py's StepBatch), computed from the
SchedulerOutput the scheduler emits, before the step's tokens are counted as computed.
`minivllm sim calibrate` describes the real engine's steps with the same function, so a
fitted profile and the simulator see one vocabulary.

Cost models: `roofline:PRESET` (sim/roofline.py), `profile:PATH` (sim/profile.py) and
`operators:PATH` (sim/operators_model.py). All add the disk tier's transfers (`disk_time`) to
what they price.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from minivllm.core.step_batch import StepBatch

# The disk tier's rates (bytes/s) where nothing measured them: our assumption for a
# datacenter NVMe SSD behind the engine's Python path, which checksums every block file
# (model/kv_disk.py). `sim calibrate` measures this machine's; --kv-offloading-read-gbps and
# --kv-offloading-write-gbps set them.
DEFAULT_DISK_READ_BANDWIDTH = 2e9
DEFAULT_DISK_WRITE_BANDWIDTH = 1e9


class CostModel(ABC):
    """Step time in seconds from a StepBatch; optionally a default KV capacity."""

    name = "abstract"
    kv_bytes_per_token: int | None = None  # at the KV cache's dtype (None: unknown)
    disk_read_bandwidth = DEFAULT_DISK_READ_BANDWIDTH
    disk_write_bandwidth = DEFAULT_DISK_WRITE_BANDWIDTH

    @abstractmethod
    def step_time(self, batch: StepBatch) -> float:
        """Seconds the step takes on the modelled machine."""

    def disk_time(self, b: StepBatch) -> float:
        """Seconds of the step's disk-tier transfers: the runner writes and reads the block
        files before the forward, one after the other, so a step pays them on top."""
        if not (b.num_disk_load_tokens or b.num_disk_write_tokens):
            return 0.0
        return self.kv_bytes_per_token * (b.num_disk_load_tokens / self.disk_read_bandwidth
                                          + b.num_disk_write_tokens / self.disk_write_bandwidth)

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


class MeasuredEngine(CostModel):
    """A cost model measured on a real engine (profile, operators): what that engine had
    (`engine`: max_model_len, ...) becomes the simulator's defaults."""

    engine: dict

    def num_swap_blocks(self, block_size: int, swap_space_gib: float) -> int | None:
        per_token = self.kv_bytes_per_token
        return int(swap_space_gib * (1 << 30) // (per_token * block_size)) if per_token else None

    def max_model_len(self) -> int | None:
        return self.engine.get("max_model_len")
