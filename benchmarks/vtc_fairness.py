"""VTC's targets on the simulator (virtual time, so the figures do not depend on this machine's
load): two tenants, one sending 10x the other's rate.

1. Both backlogged: each sends more than half the capacity. Per-tenant served tokens per second
   over the arrival window, under fcfs and vtc (target: within 10% of each other under vtc,
   where fcfs serves the heavy tenant several times more).
2. A light tenant below its fair share (10% of capacity) beside a heavy one (2x capacity): its
   mean TTFT against its TTFT alone (target: within 20% under vtc).

Capacity is measured first: requests per second the preset serves when saturated with the
same request shape. Every request has the same shape, so served tokens (prompt + output) and
VTC's weighted service order the tenants alike.

    .venv/bin/python benchmarks/vtc_fairness.py [--preset rtx4090-qwen2.5-7b] [--window 20]
"""

from __future__ import annotations

import argparse
import logging
import statistics

import numpy as np

from minivllm.bench.workload import Trace, TraceEntry
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.sim.cost_model_spec import load_cost_model
from minivllm.sim.simulator import Simulator

HEAVY, LIGHT = 1, 2


def poisson_arrivals(rate: float, window: float, user: int, rng, prompt: int, output: int):
    times = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * window * 2) + 10))
    return [TraceEntry(float(t), user, prompt, output) for t in times if t < window]


def simulate(config: SchedulerConfig, cost, policy: str, entries: list[TraceEntry],
             **options):
    trace = Trace("two-tenants", sorted(entries, key=lambda e: e.send_time))
    sim = Simulator(config, policy, cost, policy_options=options)
    return sim.run(trace)


def token_times(result) -> list[float]:
    """When each of a request's output tokens came, on the simulated clock."""
    if result.ttft is None:
        return []
    times = [result.start + result.ttft]
    for gap in result.itl:
        times.append(times[-1] + gap)
    return times


def served_per_s(results, user: int, until: float, prompt: int) -> float:
    """Tokens (prompt once its first token came, then each output token) served to a tenant
    by `until`, per second."""
    total = 0
    for r in results:
        if r.user != user:
            continue
        times = [t for t in token_times(r) if t <= until]
        total += (prompt if times else 0) + len(times)
    return total / until


def mean_ttft(results, user: int) -> float:
    return statistics.mean(r.ttft for r in results if r.user == user and r.ttft is not None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="rtx4090-qwen2.5-7b")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--prompt", type=int, default=256, help="prompt tokens of every request")
    p.add_argument("--output", type=int, default=64, help="output tokens of every request")
    p.add_argument("--window", type=float, default=20.0, help="seconds of arrivals")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    logging.getLogger("minivllm").setLevel(logging.ERROR)
    cost = load_cost_model(f"roofline:{args.preset}")
    block_size = 16
    config = SchedulerConfig(num_blocks=cost.num_kv_blocks(block_size), block_size=block_size,
                             max_num_seqs=args.max_num_seqs, max_num_batched_tokens=512,
                             max_model_len=cost.max_model_len())
    shape = (args.prompt, args.output)

    burst = [TraceEntry(0.0, HEAVY, *shape) for _ in range(8 * args.max_num_seqs)]
    done = simulate(config, cost, "fcfs", burst)
    capacity = len(burst) / done.stats.simulated_wall_time_s
    print(f"{cost.name}, max_num_seqs {args.max_num_seqs}, requests of {shape[0]} + {shape[1]} "
          f"tokens: capacity {capacity:.1f} req/s ({capacity * sum(shape):.0f} tok/s)\n")

    rng = np.random.default_rng(args.seed)
    light_rate = 0.6 * capacity
    both = (poisson_arrivals(10 * light_rate, args.window, HEAVY, rng, *shape)
            + poisson_arrivals(light_rate, args.window, LIGHT, rng, *shape))
    print(f"1. both backlogged: heavy {10 * light_rate:.1f} req/s, light {light_rate:.1f} req/s "
          f"(0.6x capacity), served over the {args.window:g} s window")
    print("| policy | heavy tok/s | light tok/s | heavy / light |\n|---|---|---|---|")
    for policy in ("fcfs", "vtc"):
        results = simulate(config, cost, policy, both).results
        heavy, light = (served_per_s(results, u, args.window, args.prompt) for u in (HEAVY, LIGHT))
        print(f"| {policy} | {heavy:.0f} | {light:.0f} | {heavy / light:.2f} |")

    light_rate = 0.1 * capacity
    light_only = poisson_arrivals(light_rate, args.window, LIGHT, rng, *shape)
    heavy = poisson_arrivals(2 * capacity, args.window, HEAVY, rng, *shape)
    alone = mean_ttft(simulate(config, cost, "fcfs", light_only).results, LIGHT)
    print(f"\n2. light tenant at {light_rate:.1f} req/s (0.1x capacity) beside heavy at "
          f"{2 * capacity:.1f} req/s (2x): light's mean TTFT, alone {alone * 1000:.0f} ms")
    print("| policy | light mean TTFT (ms) | vs alone |\n|---|---|---|")
    for label, policy, extra in (("fcfs", "fcfs", {}), ("vtc", "vtc", {}),
                                 ("vtc, active preemption", "vtc", {"active": True})):
        cfg = config if not extra else SchedulerConfig(**{**vars(config),
                                                          "active_preemption": True,
                                                          "min_run_quantum": 1})
        ttft = mean_ttft(simulate(cfg, cost, policy, light_only + heavy).results, LIGHT)
        print(f"| {label} | {ttft * 1000:.0f} | {ttft / alone:.2f}x |")


if __name__ == "__main__":
    main()
