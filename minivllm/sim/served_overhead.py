"""What `minivllm serve` adds to the engine core's time, as the simulator prices it
(`sim calibrate --served`, sim/served_calibrate.py, measures it on this machine):

- per request: `request_in_s` (HTTP parse, validation, tokenization, the message to the
  core: the server's frontend_in) and `first_token_out_s` (the token back to the
  frontend, detokenized, the stream chunk, the HTTP transfer: frontend_out plus what the
  client measures beyond the server), both on its TTFT;
- per step, `step_scale x the core's step + token_s x sampled sequences`: on a CPU the
  frontend process detokenizes and streams each token (and a load generator on the same
  machine reads them) on the cores the engine steps on. The core's thread governor
  (model/kernels/threads.py) then gives up the cores they take, so a served step is slower
  than the same step in the core alone, in proportion to its work (step_scale), plus the
  frontend's share per token it sampled (token_s).

A profile written by `sim calibrate --served` carries these under "served"; the simulator
then adds them (ServedCostModel for the steps; the request terms to each request's TTFT
and end-to-end latency).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from minivllm.core.step_batch import StepBatch
from minivllm.sim.cost_model import CostModel


@dataclass(frozen=True)
class ServedOverhead:
    request_in_s: float
    first_token_out_s: float
    step_scale: float
    token_s: float
    measured: str = ""  # how: the runs, the machine, the date

    def step_time(self, core_seconds: float, b: StepBatch) -> float:
        return self.step_scale * core_seconds + self.token_s * b.num_sampled_seqs

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict, where: str) -> ServedOverhead:
        try:
            overhead = cls(**doc)
        except TypeError as e:
            raise ValueError(f"{where}: 'served' must hold {', '.join(cls.__annotations__)}: "
                             f"{e}") from None
        for name in ("request_in_s", "first_token_out_s", "step_scale", "token_s"):
            value = getattr(overhead, name)
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{where}: served {name} must be a number >= 0, got {value!r}")
        return overhead


def fit_step_overhead(lone: tuple[float, float], batched: tuple[float, float],
                      batch: int) -> tuple[float, float]:
    """(step_scale, token_s) from two decode-bound runs, each (served TPOT, simulated TPOT)
    in seconds: one request at a time (a step samples 1 token) and `batch` at once (a step
    samples `batch`), solving served = scale x simulated + token_s x sampled through both.
    A scale under 1 or a negative token_s (noise: the server no slower than the core) is
    clamped, and the other term fitted alone."""
    (s1, b1), (sn, bn) = lone, batched
    det = b1 * batch - bn
    scale = (s1 * batch - sn) / det if det else 1.0
    token_s = (sn * b1 - s1 * bn) / det if det else 0.0
    if token_s < 0:
        return max(1.0, (s1 + sn) / (b1 + bn)), 0.0
    if scale < 1:
        return 1.0, max(0.0, ((s1 - b1) + (sn - bn)) / (1 + batch))
    return scale, token_s


class ServedCostModel(CostModel):
    """A measured cost model's steps as the server takes them: each step plus the
    frontend's share of the cores."""

    def __init__(self, base: CostModel, served: ServedOverhead) -> None:
        self.base, self.served = base, served
        self.name = f"{base.name} (served)"
        self.kv_bytes_per_token = base.kv_bytes_per_token
        self.disk_read_bandwidth = base.disk_read_bandwidth
        self.disk_write_bandwidth = base.disk_write_bandwidth

    def step_time(self, b: StepBatch) -> float:
        return self.served.step_time(self.base.step_time(b), b)

    def num_kv_blocks(self, block_size: int) -> int | None:
        return self.base.num_kv_blocks(block_size)

    def num_swap_blocks(self, block_size: int, swap_space_gib: float) -> int | None:
        return self.base.num_swap_blocks(block_size, swap_space_gib)

    def max_model_len(self) -> int | None:
        return self.base.max_model_len()

    def describe(self) -> dict:
        return {**self.base.describe(), "name": self.name, "served": self.served.as_dict()}

    def __getattr__(self, name: str):  # the base's own (engine, report, ...)
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)
