"""Is `minivllm sim plan`'s answer the real engine's? The plan's search on the simulator, then
the real engine at rates around its answer.

    python benchmarks/sim_plan_check.py --model results/smollm2-135m-instruct --threads 2 \\
        [--profile OPERATORS.json] [--workload random --input-len 128 --output-len 64
        --num-prompts 80] --slo-ttft-p99-ms 1000 --slo-tpot-p50-ms 150 [--policy fcfs]
        [--factors 0.8 0.9 1.0 1.1 1.2]

1. The process is pinned to --threads cores; the operator cost model is calibrated now on
   this machine (`sim calibrate --operators`'s code), or read from --profile.
2. `sim plan`'s search (sim/plan.py's max_rate, sim plan's probe figures) over the
   simulator, given the engine's exact scheduler configuration: the highest rate that meets
   the SLOs.
3. The same requests, sent at each factor times that rate (the same seeded arrivals, scaled),
   replayed in real time through the real EngineCore (bench/engine_replay.py; after a
   warm-up, the prefix cache emptied before each rate: the prompts repeat), judged by the
   same figures: where the engine first misses the SLOs. Each replay's steps also give the
   cost model's step-time error (predicted / measured).

The issue's target: the plan's answer within 10% of the rate at which the real engine first
misses the SLO (met at 0.9x, missed by 1.1x). Prints date, load and threads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace

import numpy as np

from minivllm.bench.engine_replay import pin_threads, replay_engine
from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.traces import build_trace
from minivllm.sim.plan import SLO, max_rate
from minivllm.sim.plan_cli import at_rate, probe_figures, table
from minivllm.sim.step_kinds import describe, relative_errors


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", default=None, help="operator tables JSON (default: calibrate "
                   "now, saved to --save-profile)")
    p.add_argument("--save-profile", default="results/sim/plan_check.operators.json")
    p.add_argument("--workload", default="random")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=80)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", default="fcfs")
    p.add_argument("--slo-ttft-p99-ms", type=float, default=None)
    p.add_argument("--slo-tpot-p50-ms", type=float, default=None)
    p.add_argument("--start-rate", type=float, default=1.0)
    p.add_argument("--factors", type=float, nargs="+", default=[0.8, 0.9, 1.0, 1.1, 1.2])
    args = p.parse_args()

    from minivllm.config import EngineConfig
    from minivllm.engine.core import EngineCore
    from minivllm.sim.operators_calibrate import calibrate_operators
    from minivllm.sim.operators_model import OperatorCostModel
    from minivllm.sim.simulator import Simulator

    slo = SLO(args.slo_ttft_p99_ms, args.slo_tpot_p50_ms)
    pinning = pin_threads(args.threads)
    print(f"CPU: {cpu_description()}; {pinning}; started {when_and_load()}")
    cost = (OperatorCostModel.load(args.profile, num_threads=args.threads) if args.profile
            else calibrate_operators(args.model, num_threads=args.threads))
    if not args.profile:
        cost.save(args.save_profile)
    print(cost.report())
    core = EngineCore(EngineConfig(model=args.model, seed=0, num_threads=args.threads,
                                   scheduling_policy=args.policy))
    config = core.scheduler.config
    trace = build_trace(args.workload, seed=args.seed, num_prompts=args.num_prompts,
                        input_len=args.input_len, output_len=args.output_len,
                        max_model_len=config.max_model_len)
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(3, core.vocab_size, e.prompt_tokens).tolist() for e in trace.entries]

    def simulated(rate: float):
        t0 = time.perf_counter()
        run = Simulator(config, args.policy, cost).run(at_rate(trace, rate, 1.0, args.seed),
                                                       prompts)
        probe = probe_figures(run.results, slo, rate, 1, run.stats.simulated_wall_time_s,
                              trace.buckets)
        print(f"[sim] {rate:.4g} req/s: SLO {'met' if probe.met else 'missed'} "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
        return probe

    answer, probes = max_rate(simulated, args.start_rate, 0.02)
    print(table(probes))
    print(f"sim plan: {answer:.4g} req/s ({cost.name}, policy {args.policy})\n")
    real = []
    warmup = replace(trace, entries=trace.entries[:8])  # the engine's first steps are slower
    replay_engine(core, at_rate(warmup, answer, 1.0, args.seed), prompts[:8])
    for factor in args.factors:
        rate = answer * factor
        load = os.getloadavg()[0]
        results, seconds, steps = replay_engine(core, at_rate(trace, rate, 1.0, args.seed),
                                                prompts)
        probe = probe_figures(results, slo, rate, 1, seconds, trace.buckets)
        real.append((factor, probe))
        by_kind = relative_errors([(b, s, cost.step_time(b)) for b, s in steps])
        print(f"[engine] {factor:g}x = {rate:.4g} req/s: SLO {'met' if probe.met else 'missed'}"
              f" (TTFT p99 {probe.ttft_p99_ms:.0f} ms, TPOT p50 {probe.tpot_p50_ms:.1f} ms; "
              f"load before {load:.2f}); the cost model on its {len(steps)} steps: predicted / "
              f"measured median {statistics.median(cost.step_time(b) / s for b, s in steps):.2f}"
              f", median / p90 error: {describe(by_kind)}", flush=True)
    print("\nthe real engine:\n" + table([p for _, p in real]))
    missed = [f for f, p in real if not p.met]
    met_below = all(p.met for f, p in real if f <= 0.9)
    first = min(missed) if missed else None
    verdict = ("within 10%" if met_below and first is not None and first <= 1.1
               else "not within 10%")
    print(f"\nplan {answer:.4g} req/s; the engine first misses at "
          f"{'none of the rates' if first is None else f'{first:g}x'}: {verdict}")
    print(f"finished {when_and_load()}")


if __name__ == "__main__":
    main()
