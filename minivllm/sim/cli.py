"""`minivllm sim serve` / `sim policies` (the bench commands, simulated: the same workload flags
and reports, the engine's scheduler on a virtual clock), `sim plan` (plan_cli.py: capacity
planning) and `sim calibrate` (fit a profile cost model to the real engine's steps); the flags
and the simulator they describe are cli_setup.py's."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from minivllm.bench import metrics, report
from minivllm.bench.args import (
    add_comparison_args,
    comparison_runs,
)
from minivllm.bench.prediction import describe as describe_prediction
from minivllm.bench.timeline_html import write_sim_timeline
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.sim import disk_report, plan_cli
from minivllm.sim.cli_setup import add_sim_args, make_simulator, prepare, split_of
from minivllm.sim.cost_model import CostModel
from minivllm.sim.disaggregated import describe_transfers
from minivllm.sim.seed_report import side_by_side
from minivllm.sim.simulator import SimResult


def add_parser(subparsers) -> None:
    sim = subparsers.add_parser("sim", help="simulate serving: the real scheduler, a virtual "
                                            "clock and a step-cost model (no model, no torch)")
    sub = sim.add_subparsers(dest="sim_command", required=True)
    serve = sub.add_parser("serve", help="bench serve, simulated")
    add_sim_args(serve, "none")
    serve.set_defaults(func=run_serve)
    pol = sub.add_parser("policies", help="bench policies, simulated")
    add_comparison_args(pol)
    add_sim_args(pol, "length", skip=("scheduling_policy", "length_predictor"))
    pol.set_defaults(func=run_policies)
    plan_cli.add_parser(sub)
    cal = sub.add_parser("calibrate", help="time the real engine's steps and fit a profile "
                                           "(--operators: time each of its operators)")
    cal.add_argument("--model", required=True, help="model directory (or minivllm-demo)")
    cal.add_argument("--operators", action="store_true",
                     help="time each operator the engine runs and write the operator cost "
                          "model (--cost-model operators:PATH) instead of a profile")
    cal.add_argument("--output", default=None, help="the JSON to write (default: "
                     "results/sim/profile.json, with --operators results/sim/operators.json)")
    cal.add_argument("--quick", action="store_true", help="a small grid (for tests)")
    cal.add_argument("--served", action="store_true",
                     help="also measure what minivllm serve adds per request and per step "
                          "on this machine (served runs of the model; profiles only)")
    cal.add_argument("--num-threads", type=int, default=None, help="torch threads")
    cal.add_argument("--max-num-batched-tokens", type=int, default=None)
    cal.add_argument("--kv-cache-dtype", default="auto",
                     help="the engine's KV cache dtype while it is timed (default: auto)")
    cal.set_defaults(func=run_calibrate)


def simulate(args, cost: CostModel, config: SchedulerConfig, trace, policy: str,
             out_dir: Path, title: str, length_predictor: str | None = None
             ) -> tuple[dict, list]:
    size = args.data_parallel_size
    predictor = length_predictor or getattr(args, "length_predictor", None) or "mean"
    split = split_of(args)
    sim = make_simulator(args, cost, config, policy, predictor, size, not args.disable_tqdm,
                         size == 1 and split is None)
    t0 = time.perf_counter()
    result: SimResult = sim.run(trace)
    elapsed = time.perf_counter() - t0
    summary = metrics.summarize(result.results, result.stats.simulated_wall_time_s,
                                trace.buckets, metrics.parse_goodput(args.goodput))
    summary["engine"] = result.stats.as_dict()
    if result.cold is not None:
        summary["warm_restart"] = disk_report.warm_restart(result)
    if size > 1:
        summary["engine"]["data_parallel"] = {
            "size": size, "router_policy": args.router_policy,
            "routed": result.routed, "prefix_cache_hit_rates": result.prefix_cache_hit_rates,
            "router_prefix_hit_tokens": result.router_prefix_hit_tokens}
        title += f", {size} replicas, router {args.router_policy}"
    if result.disaggregated is not None:
        summary["engine"]["disaggregated"] = result.disaggregated
        title += f", {split[0]} prefill + {split[1]} decode instances"
    summary["simulator_seconds"] = elapsed
    meta = {"title": title, "simulated": f"simulated, {cost.name}", "cost_model": cost.describe(),
            "workload": trace.workload, "seed": args.seed, "length_scale": trace.length_scale,
            "policy": policy, "length_predictor": predictor,
            "request_max_tokens": args.request_max_tokens,
            "priority": args.priority, "scheduler": vars(config),
            "max_concurrency": args.max_concurrency, **request_fields(args),
            "argv": sys.argv[1:]}
    report.write_run(out_dir, meta, result.results, summary)
    if result.timeline:  # one replica's (data parallel runs record none)
        write_sim_timeline(out_dir, title, result.timeline)
    print(f"[{policy}] simulated {len(result.results)} requests, "
          f"{result.stats.simulated_wall_time_s:.1f} s of serving in {elapsed:.1f} s; "
          f"length predictor {predictor}: {describe_prediction(summary['length_prediction'])}")
    if result.disaggregated is not None:
        print(f"[{policy}] " + describe_transfers(result.disaggregated))
    if getattr(sim, "disk_tier_bytes", None) is not None:
        print(f"[{policy}] " + disk_report.describe_tier(disk_report.run_figures(result)))
    if result.cold is not None:
        print(f"[{policy}] " + disk_report.describe_warm_restart(summary["warm_restart"]))
    if size > 1:
        rates = ", ".join("-" if r is None else f"{r:.1%}" for r in result.prefix_cache_hit_rates)
        print(f"[{policy}] {size} replicas, router {args.router_policy}: "
              f"requests routed {result.routed}, prefix cache hit rate {rates}")
    return summary, result.results


def request_fields(args) -> dict:
    """The workload flags a real model would read and the stand-in does not (the prompts'
    tokens, the endpoint, stop ids, seeds), for the report: what bench serve records."""
    return {"ignore_eos": args.ignore_eos, "prompt_seed": args.prompt_seed,
            "endpoint": args.endpoint, "prompt_mode": args.prompt_mode,
            "stop_token_ids": args.stop_token_ids, "request_seed": args.request_seed}


def run_serve(args) -> int:
    cost, config, trace = prepare(args)
    title = (f"{trace.workload} (seed {args.seed}), policy {args.scheduling_policy} "
             f"-- simulated, {cost.name}")
    summary, _ = simulate(args, cost, config, trace, args.scheduling_policy, Path(args.output),
                          title)
    print(report.markdown_summary(summary, title))
    print(f"report written to {args.output}/")
    return 1 if summary["completed"] == 0 else 0


def run_policies(args) -> int:
    combos = comparison_runs(args)
    policies = list(dict.fromkeys(p for _, p, _ in combos))
    cost, config, trace = prepare(args)
    if args.request_max_tokens == "trace" and len(args.length_predictors) > 1:
        print("note: --request-max-tokens trace tells every length predictor the true length "
              "through max_tokens; compare predictors with --request-max-tokens context")
    out = Path(args.output)
    runs = {}
    for name, policy, predictor in combos:
        title = (f"{trace.workload} (seed {args.seed}), policy {name} -- simulated, "
                 f"{cost.name}")
        runs[name] = simulate(args, cost, config, trace, policy, out / name.replace("/", "-"),
                              title, predictor)
    label = f"simulated, {cost.name}"
    meta = {"title": f"Policies on {trace.workload} (seed {args.seed}, length scale "
                     f"{trace.length_scale:.4g}) -- {label}",
            "simulated": label, "policies": policies, "cost_model": cost.describe(),
            "length_predictors": args.length_predictors, "runs": [c[0] for c in combos],
            "request_max_tokens": args.request_max_tokens, **request_fields(args),
            "workload": trace.workload, "seed": args.seed, "length_scale": trace.length_scale,
            "priority": args.priority, "scheduler": vars(config)}
    report.write_comparison(out, meta, runs)
    text = (out / "comparison.md").read_text()
    if trace.workload == "seed-high" and trace.length_scale == 1.0 and len(combos) == len(
            policies):
        text += "\n" + side_by_side({p: s for p, (s, _) in runs.items()}, label)
        (out / "comparison.md").write_text(text)
    print(text)
    print(f"report written to {out}/")
    return 0


def run_calibrate(args) -> int:
    if args.served and args.operators:
        raise SystemExit("--served measures on top of a profile: drop --operators")
    if args.operators:
        from minivllm.sim.operators_calibrate import calibrate_operators as calibrate
    else:
        from minivllm.sim.calibrate import calibrate
    kind = "operators" if args.operators else "profile"
    output = args.output or f"results/sim/{kind}.json"
    model = calibrate(args.model, quick=args.quick, num_threads=args.num_threads,
                      max_num_batched_tokens=args.max_num_batched_tokens,
                      kv_cache_dtype=args.kv_cache_dtype)
    model.save(output)
    print(model.report())
    if args.served:
        from minivllm.sim.served_calibrate import add_served, calibrate_served

        served = calibrate_served(args.model, output, args.num_threads)
        add_served(output, served)
        print(f"served: {served.request_in_s * 1e3:.1f} ms in and "
              f"{served.first_token_out_s * 1e3:.1f} ms out per request, "
              f"steps x {served.step_scale:.3f} + {served.token_s * 1e3:.2f} ms a sampled "
              f"sequence ({served.measured})")
    print(f"{kind} written to {output} (use --cost-model {kind}:{output}"
          f"{'; the served path priced' if args.served else ''})")
    return 0
