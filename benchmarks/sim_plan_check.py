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

--served checks the plan against the server people run instead (issue 73): `minivllm
serve MODEL`, warmed on prompts of their own, then `minivllm bench serve` at each factor
times the plan's rate (default 0.9x and 1.15x), --repeats runs each, every run's prompts
fresh (sim/served_check.py: a seed per run; re-sent prompts would be answered from the
prefix cache). --plan PLAN.json takes the rate from `minivllm sim plan` instead of
planning here:

    python benchmarks/sim_plan_check.py --served --model MODEL --plan results/sim/plan/plan.json \
        --slo-ttft-p99-ms 2000 --slo-tpot-p50-ms 300 --input-len 128 --output-len 128 \
        --num-prompts 96 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from minivllm.bench.engine_replay import pin_threads, replay_engine
from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.traces import build_trace
from minivllm.sim.plan import SLO, max_rate
from minivllm.sim.plan_cli import at_rate, probe_figures, table
from minivllm.sim.step_kinds import describe, relative_errors


def plan_here(args, slo: SLO) -> float:
    """sim plan's answer for the engine's exact configuration, the cost model calibrated
    now (or --profile)."""
    from minivllm.config import EngineConfig
    from minivllm.engine.core import EngineCore
    from minivllm.sim.operators_calibrate import calibrate_operators
    from minivllm.sim.operators_model import OperatorCostModel
    from minivllm.sim.simulator import Simulator

    cost = (OperatorCostModel.load(args.profile, num_threads=args.threads) if args.profile
            else calibrate_operators(args.model, num_threads=args.threads))
    config = EngineCore(EngineConfig(model=args.model, seed=0, num_threads=args.threads,
                                     scheduling_policy=args.policy)).scheduler.config
    trace = build_trace(args.workload, seed=args.seed, num_prompts=args.num_prompts,
                        input_len=args.input_len, output_len=args.output_len,
                        max_model_len=config.max_model_len)

    def simulated(rate: float):
        run = Simulator(config, args.policy, cost).run(at_rate(trace, rate, 1.0, args.seed))
        return probe_figures(run.results, slo, rate, 1, run.stats.simulated_wall_time_s,
                             trace.buckets)

    answer, probes = max_rate(simulated, args.start_rate, 0.02)
    print(table(probes))
    return answer


def check_served(args, slo: SLO) -> None:
    from minivllm.bench.server_process import free_port, server_command, start_server, stop_server
    from minivllm.sim.served_check import check_run, judged, prediction_errors, served_runs

    print(f"CPU: {cpu_description()}; started {when_and_load()}")
    plan = json.loads(Path(args.plan).read_text()) if args.plan else None
    answer = plan["max_request_rate"] if plan else plan_here(args, slo)
    cost_model = args.cost_model or (plan["cost_model"]["name"].removesuffix(" (served)")
                                     if plan else None)
    print(f"the plan: {answer:.4g} req/s; each run also simulated on {cost_model}")
    workload = ["--workload", args.workload, "--input-len", str(args.input_len),
                "--output-len", str(args.output_len)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path("results/sim/plan_check.server.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    # as `minivllm serve MODEL` runs (and `sim calibrate --served` measured it): its thread
    # governor on, unless --server-threads fixes the count (docs/lab-simulator.md: fixed, the
    # engine's threads contend with the frontend and the client on a small machine)
    threads = ["--num-threads", str(args.server_threads)] if args.server_threads else []
    proc, _ = start_server(server_command(args.model, port, args.policy, threads), log, url)
    try:
        warmup, runs = served_runs(args.seed, args.factors, args.repeats)
        check_run(url, None, answer, warmup, args.warmup_prompts, workload)
        rows = []
        for run in runs:
            load = os.getloadavg()[0]
            rate = answer * run.factor
            served, simulated = check_run(url, cost_model, rate, run.seed, args.num_prompts,
                                          workload)
            probe = judged(served, rate, slo)
            rows.append((run, probe))
            errors = ("" if simulated is None else "; simulated / served - 1: " + ", ".join(
                f"{k} {v:+.0%}" for k, v in prediction_errors(served, simulated).items()))
            print(f"[served] {run.factor:g}x = {rate:.4g} req/s, seed {run.seed}: SLO "
                  f"{'met' if probe.met else 'missed'} (TTFT p50 "
                  f"{served['ttft_ms']['median']:.0f} / p99 {probe.ttft_p99_ms:.0f} ms, TPOT "
                  f"p50 {probe.tpot_p50_ms:.1f} ms; load before {load:.2f}){errors}",
                  flush=True)
    finally:
        stop_server(proc)
    print("\nminivllm serve:\n" + table([p for _, p in rows]))
    for factor in args.factors:
        met = sum(p.met for r, p in rows if r.factor == factor)
        print(f"{factor:g}x: SLO met in {met} of {args.repeats} runs")
    below = all(p.met for r, p in rows if r.factor <= 0.9)
    above = all(not p.met for r, p in rows if r.factor >= 1.15)
    print(f"the plan holds for the server (met at <= 0.9x, missed at >= 1.15x in every run): "
          f"{'yes' if below and above else 'no'}; finished {when_and_load()}")


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
    p.add_argument("--factors", type=float, nargs="+", default=None,
                   help="of the planned rate (default: 0.8 0.9 1.0 1.1 1.2; --served: 0.9 1.15)")
    p.add_argument("--served", action="store_true", help="check against minivllm serve")
    p.add_argument("--plan", default=None, help="--served: the rate of this plan.json")
    p.add_argument("--cost-model", default=None,
                   help="--served: simulate each run on this (default: the plan's, its "
                        "served terms included when it has them)")
    p.add_argument("--repeats", type=int, default=3, help="--served: runs per factor")
    p.add_argument("--server-threads", type=int, default=None,
                   help="--served: the server's --num-threads (default: its own governor)")
    p.add_argument("--warmup-prompts", type=int, default=16)
    args = p.parse_args()
    if args.factors is None:
        args.factors = [0.9, 1.15] if args.served else [0.8, 0.9, 1.0, 1.1, 1.2]
    if args.served:
        return check_served(args, SLO(args.slo_ttft_p99_ms, args.slo_tpot_p50_ms))

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
