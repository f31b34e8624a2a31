"""`minivllm sim plan`: capacity planning. The highest request rate one replica sustains
within the SLOs (TTFT p99, TPOT p50, optionally a goodput ratio), found by simulating the
workload's requests sent as a Poisson process at candidate rates (sim/plan.py's search),
each rate over --seeds workloads (their lengths and arrivals drawn from seeds SEED,
SEED+1, ...): a rate is met when the SLOs hold in --confidence of them. With --target-rate,
the replicas that rate needs, checked by simulating them behind the router. Writes
OUTPUT/plan.json, with each rate's spread over the seeds and the answer's margin."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from minivllm.bench import metrics, traces
from minivllm.bench.args import trace_args
from minivllm.bench.workload import Trace, arrival_times
from minivllm.core.policy import POLICIES
from minivllm.sim.cli_setup import add_sim_args, make_simulator, prepare
from minivllm.sim.kv_link import DEFAULT_KV_TRANSFER_BANDWIDTH
from minivllm.sim.plan import SLO, PlanError, Probe, judge, max_rate, over_seeds, spread
from minivllm.sim.plan_disaggregated import compare_splits, fewest_for_target
from minivllm.sim.plan_disaggregated import describe as describe_disaggregated

MAX_EXTRA_REPLICAS = 8  # beyond ceil(target / max rate), when the router's split falls short


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="capacity planning: the highest request rate one replica "
                                    "serves within SLOs, the replicas a target rate needs")
    g = p.add_argument_group("plan")
    g.add_argument("--slo-ttft-p99-ms", type=float, default=None, metavar="MS",
                   help="TTFT p99 at most MS milliseconds")
    g.add_argument("--slo-tpot-p50-ms", type=float, default=None, metavar="MS",
                   help="TPOT median at most MS milliseconds")
    g.add_argument("--min-goodput-ratio", type=float, default=None, metavar="F",
                   help="and at least this fraction of the requests within both SLOs, each "
                        "on its own (default: not required)")
    g.add_argument("--policy", dest="scheduling_policy", default="fcfs", metavar="POLICY",
                   help=f"the scheduling policy ({', '.join(sorted(POLICIES))}; default: fcfs)")
    g.add_argument("--target-rate", type=float, default=None, metavar="R",
                   help="req/s to serve: the replicas it needs, checked by simulation")
    g.add_argument("--start-rate", type=float, default=1.0, metavar="R",
                   help="the first rate simulated; the search doubles or halves from it "
                        "(default: 1 req/s)")
    g.add_argument("--tolerance", type=float, default=0.02,
                   help="relative width of the final bracket (default: 0.02)")
    g.add_argument("--seeds", type=int, default=5, metavar="N",
                   help="workloads simulated at each rate, drawn from seeds --seed, "
                        "--seed + 1, ... (default: 5)")
    g.add_argument("--confidence", type=float, default=0.9, metavar="F",
                   help="the share of the seeds in which the SLOs must hold (default: 0.9; "
                        "with 5 seeds, all 5)")
    g.add_argument("--disaggregated", action="store_true",
                   help="also plan prefill/decode disaggregation: each split of --instances "
                        "against as many colocated replicas, or with --target-rate the "
                        "fewest instances and their split that serve it")
    g.add_argument("--instances", type=int, default=2, metavar="N",
                   help="--disaggregated without --target-rate: the instances to split "
                        "(default: 2)")
    add_sim_args(p, "none", skip=("scheduling_policy",))
    p.set_defaults(output="results/sim/plan", func=run_plan)


def at_rate(trace: Trace, rate: float, burstiness: float, seed: int) -> Trace:
    """The trace's requests in their order, sent as a gamma process (Poisson at burstiness
    1) at `rate`: the same seeded draws at every rate, so only the time scale changes."""
    times = arrival_times(len(trace.entries), rate, burstiness, np.random.default_rng(seed))
    return replace(trace, entries=[replace(e, send_time=float(t))
                                   for e, t in zip(trace.entries, times, strict=True)])


def probe_figures(results: list, slo: SLO, rate: float, replicas: int,
                  duration: float, buckets) -> Probe:
    never_fit = sum(1 for r in results if not r.success and (r.error or "").startswith("HTTP 400"))
    done = [r for r in results if r.success]
    failed = len(results) - len(done) - never_fit
    summary = metrics.summarize(done, duration, buckets)
    slos = {k: v for k, v in (("ttft", slo.ttft_p99_ms), ("tpot", slo.tpot_p50_ms)) if v}
    ratio = sum(metrics.is_good(r, slos) for r in done) / max(1, len(results) - never_fit)
    ttft, tpot = summary["ttft_ms"]["p99"], summary["tpot_ms"]["median"]
    return Probe(rate, replicas, ttft, tpot, ratio, len(done), failed, never_fit,
                 judge(slo, ttft, tpot, ratio, len(done), failed))


def seeded_trace(args, config, seed: int) -> Trace:
    """The workload the flags describe, drawn from another seed."""
    return traces.build_trace(args.workload, max_model_len=config.max_model_len,
                              **{**trace_args(args), "seed": seed})


def margin(slo: SLO, probe: Probe) -> dict:
    """Each latency SLO's headroom at a probe: 1 - figure / limit (0.05: 5% under it)."""
    return {name: 1 - value / limit for name, limit, value in (
        ("ttft_p99_ms", slo.ttft_p99_ms, probe.ttft_p99_ms),
        ("tpot_p50_ms", slo.tpot_p50_ms, probe.tpot_p50_ms))
        if limit is not None and value is not None}


def _check(args) -> SLO:
    try:
        slo = SLO(args.slo_ttft_p99_ms, args.slo_tpot_p50_ms, args.min_goodput_ratio)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if args.scheduling_policy not in POLICIES:
        raise SystemExit(f"--policy: unknown policy {args.scheduling_policy!r}; known: "
                         f"{', '.join(sorted(POLICIES))}")
    for flag, value in (("--target-rate", args.target_rate), ("--start-rate", args.start_rate)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise SystemExit(f"{flag} must be a positive number of req/s, got {value}")
    if not 0 < args.tolerance < 1:
        raise SystemExit(f"--tolerance must be in (0, 1), got {args.tolerance}")
    if args.seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {args.seeds}")
    if not 0 < args.confidence <= 1:
        raise SystemExit(f"--confidence must be in (0, 1], got {args.confidence}")
    if math.isfinite(args.request_rate):
        raise SystemExit("sim plan chooses the request rates: drop --request-rate")
    if args.prefill_instances is not None or args.decode_instances is not None:
        raise SystemExit("sim plan chooses the split (--disaggregated): drop "
                         "--prefill-instances / --decode-instances")
    if args.instances != 2 and not args.disaggregated:
        raise SystemExit("--instances: only with --disaggregated")
    if args.disaggregated and args.instances < 2:
        raise SystemExit(f"--instances must be >= 2 (a prefill and a decode one), got "
                         f"{args.instances}")
    if args.data_parallel_size != 1:
        raise SystemExit("sim plan sizes one replica (--target-rate gives the replicas): "
                         "drop --data-parallel-size")
    return slo


def plan_disaggregated(args, probe, plan: dict) -> tuple[dict, list[Probe]]:
    """sim/plan_disaggregated.py's answer for the flags: the splits of --instances, or the
    fewest instances for --target-rate (up to MAX_EXTRA_REPLICAS past colocated's)."""
    if args.target_rate is None:
        answer, found = compare_splits(probe, args.instances, args.start_rate, args.tolerance)
    else:
        colocated = plan.get("replicas") or plan.get("replicas_estimate") or 1
        answer, found = fewest_for_target(probe, args.target_rate,
                                          max(2, colocated) + MAX_EXTRA_REPLICAS)
    gbps = args.kv_transfer_gbps
    answer["kv_transfer_gbps"] = DEFAULT_KV_TRANSFER_BANDWIDTH / 1e9 if gbps is None else gbps
    answer["kv_transfer_latency_ms"] = args.kv_transfer_latency_ms
    return answer, found


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _row(p: Probe) -> str:
    seeds = (f"{sum(s['met'] for s in p.seeds)}/{len(p.seeds)}" if p.seeds else "1/1" if p.met
             else "0/1")
    replicas = p.replicas if p.split is None else f"{p.split[0]}P + {p.split[1]}D"
    return (f"| {p.rate:.4g} | {replicas} | {_ms(p.ttft_p99_ms)} | {_ms(p.tpot_p50_ms)} | "
            f"{p.goodput_ratio:.1%} | {p.completed} | {p.failed} | "
            f"{'yes' if p.met else 'no'} ({seeds}) |")


def table(probes: list[Probe]) -> str:
    """Over several seeds, each figure is its quantile at the plan's confidence."""
    head = ("| req/s | replicas | TTFT p99 (ms) | TPOT p50 (ms) | within SLOs | completed | "
            "failed | SLO met (seeds) |\n|---|---|---|---|---|---|---|---|")
    return "\n".join([head, *(_row(p) for p in sorted(probes, key=lambda p: (
        p.replicas, p.split or [0], p.rate)))])


def run_plan(args) -> int:

    slo = _check(args)
    cost, config, trace = prepare(args)
    policy, predictor = args.scheduling_policy, args.length_predictor or "mean"
    print(f"[plan] its {len(trace.entries)} requests, in their order, sent as a Poisson process "
          f"(burstiness {args.burstiness:g}) at each rate probed; SLOs: TTFT p99 <= "
          f"{slo.ttft_p99_ms} ms, TPOT p50 <= {slo.tpot_p50_ms} ms (None: not asked)")

    seeds = [args.seed + i for i in range(args.seeds)]
    workloads = [(trace, args.seed)] + [(seeded_trace(args, config, seed), seed)
                                        for seed in seeds[1:]]

    def probe(rate: float, replicas: int = 1, split: tuple[int, int] | None = None) -> Probe:
        """`split`: (prefill, decode) instances, `replicas` of them in all."""
        t0 = time.perf_counter()
        per_seed = []
        for workload, seed in workloads:
            sim = make_simulator(args, cost, config, policy, predictor,
                                 replicas if split is None else 1, False, False, split)
            result = sim.run(at_rate(workload, rate, args.burstiness, seed))
            per_seed.append(probe_figures(result.results, slo, rate, replicas,
                                          result.stats.simulated_wall_time_s, workload.buckets))
        p = over_seeds(per_seed, args.confidence)
        p.split = None if split is None else list(split)
        held = sum(s.met for s in per_seed)
        on = (f"{replicas} replica(s)" if split is None
              else f"{split[0]} prefill + {split[1]} decode instances")
        print(f"[plan] {rate:.4g} req/s on {on}: SLO "
              f"{'met' if p.met else 'missed'} (held in {held} of {len(per_seed)} seeds; "
              f"{time.perf_counter() - t0:.1f} s)", flush=True)
        return p

    try:
        best, probes = max_rate(probe, args.start_rate, args.tolerance)
    except PlanError as e:
        raise SystemExit(f"{e}: the workload ({len(trace.entries)} requests) cannot load one "
                         "replica; give more requests (--num-prompts)") from None
    plan = {"max_request_rate": best, "tolerance": args.tolerance,
            "slo": {"ttft_p99_ms": slo.ttft_p99_ms, "tpot_p50_ms": slo.tpot_p50_ms,
                    "min_goodput_ratio": slo.min_goodput_ratio},
            "policy": policy, "length_predictor": predictor, "cost_model": cost.describe(),
            "workload": trace.workload, "seed": args.seed, "seeds": seeds,
            "confidence": args.confidence, "requests": len(trace.entries),
            "burstiness": args.burstiness, "scheduler": vars(config)}
    ok = best > 0
    if args.target_rate is not None and ok:
        estimate = math.ceil(args.target_rate / best)
        replicas, check = estimate, probe(args.target_rate, estimate)
        checks = [check]
        while not check.met and replicas < estimate + MAX_EXTRA_REPLICAS:
            replicas += 1
            check = probe(args.target_rate, replicas)
            checks.append(check)
        ok = check.met
        probes += checks
        plan.update(target_rate=args.target_rate, replicas_estimate=estimate,
                    replicas=replicas if ok else None, router_policy=args.router_policy,
                    replica_checks=[c.as_dict() for c in checks])
    if args.disaggregated:
        disaggregated, found = plan_disaggregated(args, probe, plan)
        plan["disaggregated"] = disaggregated
        probes += found
    at_best = next((p for p in probes if p.rate == best and p.replicas == 1
                    and p.split is None), None)
    if at_best is not None:
        plan["margin"] = margin(slo, at_best)
        plan["spread"] = spread(at_best)
    plan["probes"] = [{**p.as_dict(), "spread": spread(p)} for p in probes]
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    print(table(probes))
    if best == 0:
        print(f"no rate down to {probes[-1].rate:.3g} req/s meets the SLOs")
    else:
        print(f"max request rate one replica sustains within the SLOs: {best:.4g} req/s "
              f"(within {args.tolerance:.0%}; policy {policy}, {cost.name}; the SLOs held in "
              f"{args.confidence:.0%} of {args.seeds} seeds)")
        if plan.get("margin"):
            print("margin there: " + ", ".join(f"{k} {v:.1%} under the SLO"
                                                for k, v in plan["margin"].items()) +
                  "; spread over the seeds: " + ", ".join(
                      f"{k} {v['min']:.1f}..{v['max']:.1f}" for k, v in plan["spread"].items()))
    if "replicas_estimate" in plan:
        if ok:
            print(f"{args.target_rate:g} req/s needs {plan['replicas']} replicas "
                  f"(ceil({args.target_rate:g} / {best:.4g}) = {plan['replicas_estimate']}; "
                  f"checked behind the {args.router_policy} router)")
        else:
            print(f"{args.target_rate:g} req/s: the SLOs missed even with {replicas} replicas "
                  f"behind the {args.router_policy} router")
    for line in describe_disaggregated(plan.get("disaggregated") or {}):
        print(line)
    print(f"plan written to {out}/plan.json")
    return 0 if ok else 1
