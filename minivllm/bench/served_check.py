"""A capacity plan checked against `minivllm serve`: the planned rate's neighbours sent
through `minivllm bench serve`, each run's prompts fresh.

Fresh matters: the server keeps a prefix cache, so a run that re-sends prompts a run before
it sent is answered from the cache and measures the cache, not the capacity (re-sending the
same seeded prompts: TTFT p99 558 ms against 3,977 ms for the identical run before it). A
bench run's prompts are drawn from its --seed (bench/prompts.py), so every run here, the
warm-up's included, has a seed of its own (`served_runs`).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from minivllm.sim.plan import SLO, Probe, judge

WARMUP_SEED_OFFSET = 1000  # the warm-up's seed, past the plan's workload seeds


@dataclass(frozen=True)
class ServedRun:
    factor: float  # of the planned rate
    seed: int  # its prompts' and arrivals' seed: no other run's


def served_runs(seed: int, factors: list[float], repeats: int) -> tuple[int, list[ServedRun]]:
    """The warm-up's seed, and each factor's `repeats` runs (factor-major), every seed
    distinct."""
    warmup = seed + WARMUP_SEED_OFFSET
    runs = [ServedRun(factor, warmup + 1 + i * repeats + r)
            for i, factor in enumerate(factors) for r in range(repeats)]
    return warmup, runs


def bench_serve(base_url: str, rate: float, seed: int, num_prompts: int, workload: list[str],
                slo: SLO, output: Path | None = None) -> Probe:
    """One `minivllm bench serve` run at `rate` (Poisson), judged against the SLOs."""
    from minivllm.cli import main

    with tempfile.TemporaryDirectory() as scratch:
        out = output or Path(scratch)
        code = main(["bench", "serve", "--base-url", base_url, "--request-rate", f"{rate:.6g}",
                     "--seed", str(seed), "--num-prompts", str(num_prompts), "--ignore-eos",
                     "--disable-tqdm", "--output", str(out), *workload])
        if code != 0:
            raise RuntimeError(f"bench serve at {rate:.4g} req/s (seed {seed}) failed: {code}")
        summary = json.loads((out / "run.json").read_text())["summary"]
    ttft, tpot = summary["ttft_ms"]["p99"], summary["tpot_ms"]["median"]
    completed, failed = summary["completed"], summary["failed"]
    goodput = completed / max(1, completed + failed)
    return Probe(rate, 1, ttft, tpot, goodput, completed, failed, 0,
                 judge(slo, ttft, tpot, goodput, completed, failed))
