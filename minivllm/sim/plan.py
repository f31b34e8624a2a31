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

import math
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
    # over several workload seeds: each seed's figures; the fields above are then their
    # quantile at the plan's confidence, and `met` says the SLOs held in that share of seeds
    seeds: list[dict] | None = None
    split: list[int] | None = None  # prefill and decode instances (None: colocated replicas)

    def as_dict(self) -> dict:
        return asdict(self)


def over_seeds(probes: list[Probe], confidence: float) -> Probe:
    """One rate's probes, one per seed, as one: the SLOs met when they held in at least
    `confidence` of the seeds; each latency the smallest value that at least that share of
    the seeds stay within (the goodput ratio: the largest that they reach), so a plan
    judged on these figures holds for that share of the workloads the seeds draw."""
    first = probes[0]
    if len(probes) == 1:
        return first

    def bound(values: list, high: bool):
        values = sorted(v for v in values if v is not None)
        if len(values) < len(probes):
            return None  # a seed where it could not be measured: no bound
        index = math.ceil(confidence * len(values)) - 1
        return values[index] if high else values[len(values) - 1 - index]

    met = sum(p.met for p in probes) >= confidence * len(probes) - 1e-9
    return Probe(first.rate, first.replicas,
                 bound([p.ttft_p99_ms for p in probes], True),
                 bound([p.tpot_p50_ms for p in probes], True),
                 bound([p.goodput_ratio for p in probes], False),
                 sum(p.completed for p in probes), sum(p.failed for p in probes),
                 sum(p.never_fit for p in probes), met,
                 seeds=[{k: v for k, v in p.as_dict().items() if k not in ("seeds", "rate",
                                                                          "replicas", "split")}
                        for p in probes])


def spread(probe: Probe) -> dict:
    """min / median / max over the seeds of each latency figure (empty for one seed)."""
    if not probe.seeds:
        return {}
    out = {}
    for key in ("ttft_p99_ms", "tpot_p50_ms"):
        values = sorted(s[key] for s in probe.seeds if s[key] is not None)
        if values:
            out[key] = {"min": values[0], "median": values[len(values) // 2],
                        "max": values[-1]}
    return out


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
