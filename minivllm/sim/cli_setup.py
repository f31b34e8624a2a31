"""What the simulator's commands share (cli.py's sim serve / sim policies, plan_cli.py's sim
plan): their flags, and the cost model, scheduler settings, trace and simulator those flags
describe."""

from __future__ import annotations

import argparse
from dataclasses import replace

from minivllm.bench import metrics, traces
from minivllm.bench.args import add_workload_args, describe_trace, resolve_endpoint, trace_args
from minivllm.config import ENGINE_ARGS
from minivllm.core.router import DEFAULT_ROUTER_POLICY, ROUTER_POLICIES
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.entrypoints.engine_args import add_engine_args, config_from_args
from minivllm.sim.cost_model import CostModel
from minivllm.sim.cost_model_spec import load_cost_model
from minivllm.sim.simulator import Simulator

# The engine flags that change what the scheduler does; the rest are the model runner's.
SIM_ENGINE_ARGS = ("block_size", "num_kv_blocks", "swap_space", "enable_prefix_caching",
                   "preemption_victim", "vtc_weights", "vtc_tenant_weights", "edf_action",
                   "ttft_slo_ms", "e2e_slo_ms", "mlfq_base_quantum", "residual_sjf_max_wait_ms",
                   "target_tpot_ms", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                   "enable_chunked_prefill", "scheduling_policy", "preemption_mode",
                   "priority_aging_s", "active_preemption", "min_run_quantum",
                   "length_predictor", "speculative_config", "max_loras")
DEFAULT_COST_MODEL = "roofline:rtx4090-qwen2.5-7b"


def add_sim_args(p: argparse.ArgumentParser, default_priority: str, skip: tuple = ()) -> None:
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
