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
import subprocess
import sys
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


def run_json(argv: list[str], where: Path) -> dict:
    """`minivllm ARGV --output WHERE` in a process of its own (a client apart from the
    server, as a user's); its run.json."""
    done = subprocess.run([sys.executable, "-m", "minivllm.cli", *argv, "--output",
                           str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"minivllm {' '.join(argv)} failed ({done.returncode}): "
                           f"{done.stderr[-2000:]}")
    return json.loads((where / "run.json").read_text())


def judged(summary: dict, rate: float, slo: SLO) -> Probe:
    """A run's summary as a probe at `rate`, judged against the SLOs."""
    ttft, tpot = summary["ttft_ms"]["p99"], summary["tpot_ms"]["median"]
    completed, failed = summary["completed"], summary["failed"]
    goodput = completed / max(1, completed + failed)
    return Probe(rate, 1, ttft, tpot, goodput, completed, failed, 0,
                 judge(slo, ttft, tpot, goodput, completed, failed))


def served_and_simulated(base_url: str, cost_model: str | None, flags: list[str]
                         ) -> tuple[dict, dict | None]:
    """The workload `flags` describe, sent by `minivllm bench serve` and, given a cost
    model, simulated by `minivllm sim serve` (the same seed, the same arrivals): their
    run.json documents."""
    with tempfile.TemporaryDirectory() as scratch:
        served = run_json(["bench", "serve", "--base-url", base_url, *flags],
                          Path(scratch) / "served")
        simulated = (run_json(["sim", "serve", "--cost-model", cost_model, *flags],
                              Path(scratch) / "simulated") if cost_model else None)
    return served, simulated


def check_run(base_url: str, cost_model: str | None, rate: float, seed: int,
              num_prompts: int, workload: list[str]) -> tuple[dict, dict | None]:
    """One run at `rate` (Poisson), served and simulated: their summaries."""
    served, simulated = served_and_simulated(
        base_url, cost_model, ["--request-rate", f"{rate:.6g}", "--seed", str(seed),
                               "--num-prompts", str(num_prompts), "--ignore-eos",
                               "--disable-tqdm", *workload])
    return served["summary"], simulated["summary"] if simulated else None


def prediction_errors(served: dict, simulated: dict) -> dict[str, float]:
    """simulated / served - 1 for TTFT p50 and p99 and TPOT p50."""
    pairs = {"ttft_p50": ("ttft_ms", "median"), "ttft_p99": ("ttft_ms", "p99"),
             "tpot_p50": ("tpot_ms", "median")}
    return {name: simulated[a][b] / served[a][b] - 1 for name, (a, b) in pairs.items()}
