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
from minivllm.sim.disaggregated import DisaggregatedSimulator
from minivllm.sim.kv_link import DEFAULT_KV_TRANSFER_BANDWIDTH
from minivllm.sim.roofline import GIB
from minivllm.sim.simulator import Simulator

# The engine flags that change what the scheduler does; the rest are the model runner's.
SIM_ENGINE_ARGS = ("block_size", "num_kv_blocks", "swap_space", "enable_prefix_caching",
                   "preemption_victim", "vtc_weights", "vtc_tenant_weights", "edf_action",
                   "ttft_slo_ms", "e2e_slo_ms", "mlfq_base_quantum", "residual_sjf_max_wait_ms",
                   "target_tpot_ms", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                   "enable_chunked_prefill", "scheduling_policy", "preemption_mode",
                   "priority_aging_s", "active_preemption", "min_run_quantum",
                   "length_predictor", "speculative_config", "max_loras", "kv_cache_dtype",
                   "kv_offloading_backend", "kv_offloading_size")
DEFAULT_COST_MODEL = "roofline:rtx4090-qwen2.5-7b"


def add_sim_args(p: argparse.ArgumentParser, default_priority: str, skip: tuple = ()) -> None:
    p.add_argument("--cost-model", default=None,
                   help=f"roofline:PRESET, profile:PATH or operators:PATH (default: "
                        f"{DEFAULT_COST_MODEL})")
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
    p.add_argument("--kv-offloading-warm-restart", type=float, default=None, metavar="F",
                   help="with --kv-offloading-backend disk: what a persistent prefix cache "
                        "saves. The trace's first F of requests run, the engine restarts "
                        "(memory empty), and the rest runs with the disk tier as left and "
                        "with an empty one; reported side by side (F = 1: the whole trace, "
                        "then all of it again)")
    p.add_argument("--kv-offloading-read-gbps", type=float, default=None, metavar="GB/S",
                   help="the disk tier's read rate (default: what calibrate measured for a "
                        "profile, the preset's for a roofline)")
    p.add_argument("--kv-offloading-write-gbps", type=float, default=None, metavar="GB/S",
                   help="the disk tier's write rate (default: as --kv-offloading-read-gbps)")
    g = p.add_argument_group("prefill/decode disaggregation (sim/disaggregated.py)")
    g.add_argument("--prefill-instances", type=int, default=None, metavar="P",
                   help="P replicas run the prompts (and first tokens), behind the router")
    g.add_argument("--decode-instances", type=int, default=None, metavar="D",
                   help="D replicas continue them, each receiving the prompt's KV blocks")
    g.add_argument("--kv-transfer-gbps", type=float, default=None, metavar="GB/S",
                   help=f"each decode replica's link, one transfer at a time (default: "
                        f"{DEFAULT_KV_TRANSFER_BANDWIDTH / 1e9:g}, an assumption)")
    g.add_argument("--kv-transfer-latency-ms", type=float, default=0.0, metavar="MS",
                   help="added to each transfer (default: 0)")
    add_engine_args(p, skip=tuple(name for name in ENGINE_ARGS
                                  if name not in SIM_ENGINE_ARGS or name in skip))
    # No path: the simulated tier keeps an index, no bytes. None tells a size given from
    # none (refused without the backend); the engine's default applies.
    p.set_defaults(output="results/sim", kv_offloading_size=None)


def disk_tier_bytes(args) -> int | None:
    """The disk tier's capacity in bytes the flags give (None: no tier); the flags that
    need the tier are refused without it, by name."""
    if args.kv_offloading_backend is None:
        given = [flag for flag, value in (
            ("--kv-offloading-size", args.kv_offloading_size),
            ("--kv-offloading-warm-restart", args.kv_offloading_warm_restart),
            ("--kv-offloading-read-gbps", args.kv_offloading_read_gbps),
            ("--kv-offloading-write-gbps", args.kv_offloading_write_gbps)) if value is not None]
        if given:
            raise SystemExit(f"{', '.join(given)}: only with --kv-offloading-backend disk")
        return None
    if args.kv_offloading_backend != "disk":
        raise SystemExit(f"--kv-offloading-backend must be 'disk' (or unset), got "
                         f"{args.kv_offloading_backend!r}")
    size = args.kv_offloading_size
    if size is None:
        size = ENGINE_ARGS["kv_offloading_size"].default
    if not size > 0:
        raise SystemExit(f"--kv-offloading-size must be > 0 (GiB), got {size}")
    restart = args.kv_offloading_warm_restart
    if restart is not None and not 0 < restart <= 1:
        raise SystemExit(f"--kv-offloading-warm-restart is the fraction of the trace run "
                         f"before the restart: in (0, 1], got {restart}")
    return int(size * GIB)


def cost_model_of(args) -> CostModel:
    if args.preset and args.cost_model:
        raise SystemExit("give --preset or --cost-model, not both")
    spec = f"roofline:{args.preset}" if args.preset else args.cost_model or DEFAULT_COST_MODEL
    try:
        if args.num_loras and not spec.startswith("roofline:"):
            raise ValueError("--num-loras: only roofline cost models price LoRA (a profile "
                             "was measured without adapters)")
        cost = load_cost_model(spec, args.model_config, args.gpu_memory_utilization,
                               args.lora_rank, args.kv_cache_dtype)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    for flag, rate, attribute in (("--kv-offloading-read-gbps", args.kv_offloading_read_gbps,
                                   "disk_read_bandwidth"),
                                  ("--kv-offloading-write-gbps", args.kv_offloading_write_gbps,
                                   "disk_write_bandwidth")):
        if rate is not None:
            if not rate > 0:
                raise SystemExit(f"{flag} must be > 0, got {rate}")
            setattr(cost, attribute, rate * 1e9)
    return cost


def engine_config(args, **given):
    """The EngineConfig of the flags, with `given` over them. The disk tier is the
    simulator's own (disk_tier_bytes), with no folder: the engine's would need one."""
    return config_from_args(argparse.Namespace(**{**vars(args), **given,
                                                  "kv_offloading_backend": None}))


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
        engine = engine_config(args, max_model_len=max_len)
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
    disk_tier = disk_tier_bytes(args)  # its flags checked before any work
    cost = cost_model_of(args)
    if disk_tier is not None and cost.kv_bytes_per_token is None:
        raise SystemExit(f"--kv-offloading-backend disk: {cost.name} records no KV bytes per "
                         "token to size the tier's blocks (calibrate again)")
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
          f"{'on' if config.enable_chunked_prefill else 'off'}, KV cache "
          f"{args.kv_cache_dtype} ({cost.kv_bytes_per_token} bytes a token)"
          + describe_disk_tier(args, cost))
    return cost, config, trace


def describe_disk_tier(args, cost: CostModel) -> str:
    size = disk_tier_bytes(args)
    if size is None:
        return ""
    blocks = size // (cost.kv_bytes_per_token * args.block_size)
    return (f", disk tier {size / GIB:.4g} GiB ({blocks} blocks) read at "
            f"{cost.disk_read_bandwidth / 1e9:.3g} GB/s, "
            f"written at {cost.disk_write_bandwidth / 1e9:.3g} GB/s"
            + ("" if args.kv_offloading_warm_restart is None
               else f", warm restart after {args.kv_offloading_warm_restart:g} of the trace"))


def split_of(args) -> tuple[int, int] | None:
    """(prefill, decode) instances the flags ask for (None: colocated), refusing what the
    disaggregated simulator does not model, by flag."""
    p, d = args.prefill_instances, args.decode_instances
    if p is None and d is None:
        return None
    if p is None or d is None or p < 1 or d < 1:
        raise SystemExit(f"disaggregated serving needs both --prefill-instances and "
                         f"--decode-instances, each >= 1, got {p} and {d}")
    return p, d


def _check_disaggregated(args) -> None:
    given = [flag for flag, on in (
        ("--data-parallel-size", args.data_parallel_size != 1),
        ("--max-concurrency", args.max_concurrency is not None),
        ("--kv-offloading-backend", args.kv_offloading_backend is not None),
        ("--speculative-config", args.speculative_config is not None),
        ("--num-loras", bool(args.num_loras))) if on]
    if given:
        raise SystemExit(f"{', '.join(given)}: not with --prefill-instances / "
                         "--decode-instances (the disaggregated simulator models neither)")
    if args.kv_transfer_gbps is not None and not args.kv_transfer_gbps > 0:
        raise SystemExit(f"--kv-transfer-gbps must be > 0, got {args.kv_transfer_gbps}")
    if not args.kv_transfer_latency_ms >= 0:
        raise SystemExit(f"--kv-transfer-latency-ms must be >= 0, got "
                         f"{args.kv_transfer_latency_ms}")


def make_simulator(args, cost: CostModel, config: SchedulerConfig, policy: str,
                   predictor: str, size: int, progress: bool, timeline: bool,
                   split: tuple[int, int] | None = None
                   ) -> Simulator | DisaggregatedSimulator:
    """The simulator the flags describe, with `size` replicas (`timeline`: record one, which
    needs size 1), or `split` (prefill, decode) replicas (default: the flags')."""
    if size < 1:
        raise SystemExit(f"--data-parallel-size must be >= 1, got {size}")
    options = engine_config(args).policy_config.options()  # vtc_weights, edf_action, ...
    split = split or split_of(args)
    if split is not None:
        _check_disaggregated(args)
        gbps = args.kv_transfer_gbps
        try:
            return DisaggregatedSimulator(
                config, policy, cost, prefill_instances=split[0], decode_instances=split[1],
                transfer_bandwidth=DEFAULT_KV_TRANSFER_BANDWIDTH if gbps is None else gbps * 1e9,
                transfer_latency_s=args.kv_transfer_latency_ms / 1e3,
                router_policy=args.router_policy, aging_s=args.priority_aging_s,
                send_priority=policy == "priority", length_predictor=predictor,
                request_max_tokens=args.request_max_tokens, policy_options=options)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    return Simulator(config, policy, cost, aging_s=args.priority_aging_s,
                     send_priority=policy == "priority", progress=progress,
                     max_concurrency=args.max_concurrency, length_predictor=predictor,
                     request_max_tokens=args.request_max_tokens, data_parallel_size=size,
                     router_policy=args.router_policy, record_timeline=timeline,
                     policy_options=options, spec_acceptance_rate=args.spec_acceptance_rate,
                     num_loras=args.num_loras, disk_tier_bytes=disk_tier_bytes(args),
                     warm_restart=args.kv_offloading_warm_restart)
