"""`minivllm sim serve` / `sim policies` (the bench commands, simulated: the same workload flags
and reports, the engine's scheduler on a virtual clock), `sim plan` (plan_cli.py: capacity
planning) and `sim calibrate` (fit a profile cost model to the real engine's steps)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from minivllm.bench import metrics, report, traces
from minivllm.bench.args import (
    add_comparison_args,
    add_workload_args,
    comparison_runs,
    describe_trace,
    resolve_endpoint,
    trace_args,
)
from minivllm.bench.prediction import describe as describe_prediction
from minivllm.bench.timeline_html import write_sim_timeline
from minivllm.config import ENGINE_ARGS
from minivllm.core.router import DEFAULT_ROUTER_POLICY, ROUTER_POLICIES
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.entrypoints.engine_args import add_engine_args, config_from_args
from minivllm.sim.cost_model import CostModel
from minivllm.sim.cost_model_spec import load_cost_model
from minivllm.sim.seed_report import side_by_side
from minivllm.sim.simulator import SimResult, Simulator

# The engine flags that change what the scheduler does; the rest are the model runner's.
SIM_ENGINE_ARGS = ("block_size", "num_kv_blocks", "swap_space", "enable_prefix_caching",
                   "preemption_victim", "vtc_weights", "vtc_tenant_weights", "edf_action",
                   "ttft_slo_ms", "e2e_slo_ms", "mlfq_base_quantum", "residual_sjf_max_wait_ms",
                   "target_tpot_ms", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                   "enable_chunked_prefill", "scheduling_policy", "preemption_mode",
                   "priority_aging_s", "active_preemption", "min_run_quantum",
                   "length_predictor", "speculative_config", "max_loras")
DEFAULT_COST_MODEL = "roofline:rtx4090-qwen2.5-7b"


def _add_sim_args(p: argparse.ArgumentParser, default_priority: str, skip: tuple = ()) -> None:
    p.add_argument("--cost-model", default=None,
                   help=f"roofline:PRESET or profile:PATH (default: {DEFAULT_COST_MODEL})")
    p.add_argument("--preset", default=None, help="shorthand for --cost-model roofline:PRESET "
                   "(rtx4090-qwen2.5-7b, a100-80g, h100-80g, cpu)")
    p.add_argument("--model-config", default=None,
                   help="roofline: the model's config.json (or its folder) instead of the "
                        "preset's shape; no weights needed")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="roofline: fraction of device memory for weights + KV (default 0.9)")
    add_workload_args(p, default_priority)
    p.add_argument("--data-parallel-size", type=int, default=1, metavar="N",
                   help="N engine replicas behind the router, each with its own KV cache "
                        "(default: 1)")
    p.add_argument("--request-max-tokens", choices=("trace", "context"), default="trace",
                   help="trace: max_tokens = the trace's output length (requests end by "
                        "length; a length predictor, clamped to max_tokens, is told the "
                        "truth); context: max_tokens = the rest of the context, the request "
                        "stops at its trace length as at EOS, unknown until then (for "
                        "comparing length predictors; default: trace)")
    p.add_argument("--spec-acceptance-rate", type=float, default=None, metavar="P",
                   help="with --speculative-config: each draft token is right with "
                        "probability P (the simulator's stand-in model has nothing for "
                        "prompt lookup to find)")
    p.add_argument("--router-policy", choices=sorted(ROUTER_POLICIES),
                   default=DEFAULT_ROUTER_POLICY,
                   help=f"which replica serves a request (default: {DEFAULT_ROUTER_POLICY})")
    p.add_argument("--num-loras", type=int, default=0, metavar="N",
                   help="request i runs LoRA adapter i mod N (0: the base model; --max-loras "
                        "bounds the adapters of a step; roofline cost models only)")
    p.add_argument("--lora-rank", type=int, default=16,
                   help="roofline: the adapters' rank, on every projection (default: 16)")
    p.set_defaults(output="results/sim")
    add_engine_args(p, skip=tuple(name for name in ENGINE_ARGS
                                  if name not in SIM_ENGINE_ARGS or name in skip))


def add_parser(subparsers) -> None:
    sim = subparsers.add_parser("sim", help="simulate serving: the real scheduler, a virtual "
                                            "clock and a step-cost model (no model, no torch)")
    sub = sim.add_subparsers(dest="sim_command", required=True)
    serve = sub.add_parser("serve", help="bench serve, simulated")
    _add_sim_args(serve, "none")
    serve.set_defaults(func=run_serve)
    pol = sub.add_parser("policies", help="bench policies, simulated")
    add_comparison_args(pol)
    _add_sim_args(pol, "length", skip=("scheduling_policy", "length_predictor"))
    pol.set_defaults(func=run_policies)
    from minivllm.sim import plan_cli  # (it imports this module's flags and simulator)

    plan_cli.add_parser(sub)
    cal = sub.add_parser("calibrate", help="time the real engine's steps and fit a profile")
    cal.add_argument("--model", required=True, help="model directory (or minivllm-demo)")
    cal.add_argument("--output", default="results/sim/profile.json")
    cal.add_argument("--quick", action="store_true", help="a small grid (for tests)")
    cal.add_argument("--num-threads", type=int, default=None, help="torch threads")
    cal.add_argument("--max-num-batched-tokens", type=int, default=None)
    cal.set_defaults(func=run_calibrate)


def cost_model_of(args) -> CostModel:
    if args.preset and args.cost_model:
        raise SystemExit("give --preset or --cost-model, not both")
    spec = f"roofline:{args.preset}" if args.preset else args.cost_model or DEFAULT_COST_MODEL
    try:
        if args.num_loras and not spec.startswith("roofline:"):
            raise ValueError("--num-loras: only roofline cost models price LoRA (a profile "
                             "was measured without adapters)")
        return load_cost_model(spec, args.model_config, args.gpu_memory_utilization,
                               args.lora_rank)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def scheduler_config(args, cost: CostModel) -> SchedulerConfig:
    """The engine's scheduler settings: EngineConfig's scheduler section built from the
    flags (so the engine's rules apply, such as the default max_num_batched_tokens, and its
    checks), with the context and KV capacity from the cost model unless the flags give
    them."""
    max_len = args.max_model_len or cost.max_model_len()
    num_blocks = args.num_kv_blocks or cost.num_kv_blocks(args.block_size)
    if max_len is None or num_blocks is None:
        raise SystemExit(f"{cost.name} knows no context or KV capacity: give --max-model-len "
                         "and --num-kv-blocks")
    try:
        engine = config_from_args(argparse.Namespace(**{**vars(args), "max_model_len": max_len}))
    except ValueError as e:
        raise SystemExit(str(e)) from None
    return replace(engine.scheduler_config, num_blocks=num_blocks,
                   num_swap_blocks=cost.num_swap_blocks(args.block_size, args.swap_space) or 0)


def resolve_request_ending(args) -> None:
    """bench's workload resolution (--dataset-name / --dataset-path, --backend / --endpoint,
    the --ignore-eos default), then what --[no-]ignore-eos means here. The stand-in model's
    EOS comes at each request's trace output length. --ignore-eos (bench's default): the
    trace length is exact, max_tokens (--request-max-tokens trace) ends the request, no EOS
    is sampled. --no-ignore-eos: the stand-in's EOS ends it within max_tokens, at the same
    token; --request-max-tokens context (max_tokens the rest of the context, the length
    unknown until EOS) needs it, so it is its default there and --ignore-eos is refused."""
    if args.request_max_tokens == "context":
        if args.ignore_eos:
            raise SystemExit("--request-max-tokens context ends each request at the stand-in "
                             "model's EOS: drop --ignore-eos (or use --request-max-tokens trace)")
        args.ignore_eos = False
    resolve_endpoint(args)


def prepare(args):
    metrics.parse_goodput(args.goodput)
    resolve_request_ending(args)
    cost = cost_model_of(args)
    config = scheduler_config(args, cost)
    try:
        trace = traces.build_trace(args.workload, max_model_len=config.max_model_len,
                                   **trace_args(args))
    except ValueError as e:
        raise SystemExit(str(e)) from None
    print(f"{describe_trace(trace, args.length_scale)}; simulated on {cost.name}: "
          f"{config.num_blocks} KV blocks of "
          f"{config.block_size} tokens ({config.num_blocks * config.block_size} tokens), "
          f"{config.num_swap_blocks} swap blocks, context {config.max_model_len}, "
          f"max_num_batched_tokens {config.max_num_batched_tokens}, chunked prefill "
          f"{'on' if config.enable_chunked_prefill else 'off'}")
    return cost, config, trace


def make_simulator(args, cost: CostModel, config: SchedulerConfig, policy: str,
                   predictor: str, size: int, progress: bool, timeline: bool) -> Simulator:
    """The simulator the flags describe, with `size` replicas (`timeline`: record one, which
    needs size 1)."""
    if size < 1:
        raise SystemExit(f"--data-parallel-size must be >= 1, got {size}")
    options = config_from_args(args).policy_config.options()  # vtc_weights, edf_action, ...
    return Simulator(config, policy, cost, aging_s=args.priority_aging_s,
                     send_priority=policy == "priority", progress=progress,
                     max_concurrency=args.max_concurrency, length_predictor=predictor,
                     request_max_tokens=args.request_max_tokens, data_parallel_size=size,
                     router_policy=args.router_policy, record_timeline=timeline,
                     policy_options=options, spec_acceptance_rate=args.spec_acceptance_rate,
                     num_loras=args.num_loras)


def simulate(args, cost: CostModel, config: SchedulerConfig, trace, policy: str,
             out_dir: Path, title: str, length_predictor: str | None = None
             ) -> tuple[dict, list]:
    size = args.data_parallel_size
    predictor = length_predictor or getattr(args, "length_predictor", None) or "mean"
    sim = make_simulator(args, cost, config, policy, predictor, size, not args.disable_tqdm,
                         size == 1)
    t0 = time.perf_counter()
    result: SimResult = sim.run(trace)
    elapsed = time.perf_counter() - t0
    summary = metrics.summarize(result.results, result.stats.simulated_wall_time_s,
                                trace.buckets, metrics.parse_goodput(args.goodput))
    summary["engine"] = result.stats.as_dict()
    if size > 1:
        summary["engine"]["data_parallel"] = {
            "size": size, "router_policy": args.router_policy,
            "routed": result.routed, "prefix_cache_hit_rates": result.prefix_cache_hit_rates,
            "router_prefix_hit_tokens": result.router_prefix_hit_tokens}
        title += f", {size} replicas, router {args.router_policy}"
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
    print(f"[{policy}] simulated {len(trace.entries)} requests, "
          f"{result.stats.simulated_wall_time_s:.1f} s of serving in {elapsed:.1f} s; "
          f"length predictor {predictor}: {describe_prediction(summary['length_prediction'])}")
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
    from minivllm.sim.calibrate import calibrate

    profile = calibrate(args.model, quick=args.quick, num_threads=args.num_threads,
                        max_num_batched_tokens=args.max_num_batched_tokens)
    profile.save(args.output)
    print(profile.report())
    print(f"profile written to {args.output} (use --cost-model profile:{args.output})")
    return 0
