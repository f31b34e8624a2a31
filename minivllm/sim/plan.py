"""Capacity planning's search (`minivllm sim plan`): the highest request rate at which the
SLOs hold, given a probe that simulates one rate and says whether they did.

The search assumes what queueing makes true of one replica: below some rate the SLOs hold,
above it they fail. It brackets that rate by doubling or halving from `start` (one probe
meets the SLOs, a rate twice as high does not), then bisects the bracket until its width is
at most `tolerance` times its low end. The answer is the bracket's low end, a rate that was
simulated and met the SLOs; the true boundary lies below its high end, so the answer is
within `tolerance` of it. Probes at the same rate are simulated once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

LOWEST_RATE = 1e-4  # req/s: below this, no rate meets the SLOs (an answer of 0)
HIGHEST_RATE = 1e6  # req/s: above this, the search gives up (the SLOs never fail)


class PlanError(ValueError):
    """The SLOs held at every rate tried: the workload cannot load the replica."""


@dataclass
class SLO:
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    min_goodput_ratio: float | None = None  # of the requests, those within both SLOs

    def __post_init__(self) -> None:
        if self.ttft_p99_ms is None and self.tpot_p50_ms is None:
            raise ValueError("give an SLO: --slo-ttft-p99-ms MS and/or --slo-tpot-p50-ms MS")
        for name in ("ttft_p99_ms", "tpot_p50_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"--slo-{name.replace('_', '-')} must be > 0, got {value}")
        ratio = self.min_goodput_ratio
        if ratio is not None and not 0 < ratio <= 1:
            raise ValueError(f"--min-goodput-ratio must be in (0, 1], got {ratio}")


@dataclass
class Probe:
    """One simulated rate: the measured figures and whether the SLOs held."""

    rate: float
    replicas: int
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    goodput_ratio: float  # requests within every per-request SLO / requests that could fit
    completed: int
    failed: int  # failed other than by never fitting (shed): never within the SLOs
    never_fit: int  # the server's 400: fails at any rate, left out of the figures
    met: bool

    def as_dict(self) -> dict:
        return asdict(self)


def judge(slo: SLO, ttft_p99_ms: float | None, tpot_p50_ms: float | None,
          goodput_ratio: float, completed: int, failed: int) -> bool:
    """Whether figures meet the SLOs: something completed, nothing failed (shed), each SLO
    given holds (a figure that could not be measured does not)."""
    if completed == 0 or failed:
        return False
    for limit, value in ((slo.ttft_p99_ms, ttft_p99_ms), (slo.tpot_p50_ms, tpot_p50_ms)):
        if limit is not None and (value is None or value > limit):
            return False
    return slo.min_goodput_ratio is None or goodput_ratio >= slo.min_goodput_ratio


def max_rate(probe: Callable[[float], Probe], start: float = 1.0, tolerance: float = 0.02
             ) -> tuple[float, list[Probe]]:
    """(the highest rate found to meet the SLOs, every probe in the order simulated); 0.0
    when not even LOWEST_RATE does. PlanError when HIGHEST_RATE still does."""
    if not start > 0:
        raise ValueError(f"the start rate must be > 0, got {start}")
    if not 0 < tolerance < 1:
        raise ValueError(f"the tolerance must be in (0, 1), got {tolerance}")
    probes: dict[float, Probe] = {}

    def met(rate: float) -> bool:
        if rate not in probes:
            probes[rate] = probe(rate)
        return probes[rate].met

    low, high = None, None
    rate = start
    if met(rate):
        low = rate
        while met(rate * 2):
            rate *= 2
            low = rate
            if rate > HIGHEST_RATE:
                raise PlanError(f"the SLOs hold at every rate up to {rate:g} req/s")
        high = rate * 2
    else:
        high = rate
        while not met(rate / 2):
            rate /= 2
            high = rate
            if rate < LOWEST_RATE:
                return 0.0, list(probes.values())
        low = rate / 2
    while high - low > tolerance * low:
        mid = (low + high) / 2
        if met(mid):
            low = mid
        else:
            high = mid
    return low, list(probes.values())
