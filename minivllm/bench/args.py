"""The flags `bench serve`, `bench policies` and the `sim` commands share: the workload, the
report, the comparison (--policies x --length-predictors), and the endpoint."""

from __future__ import annotations

import argparse

from minivllm.bench import prompt_file, traces, workload

BACKENDS = {"openai": "completions", "openai-chat": "chat"}
CUSTOM_TEMPERATURE = 0.7  # a prompt file's answers are sampled unless --temperature says
WORKLOAD_GROUP = "workload"


def add_workload_args(p: argparse.ArgumentParser, default_priority: str) -> None:
    """The workload and report flags, one definition for `bench serve`, `bench policies`,
    `bench sweep` and the `sim` commands (so one workload command line replays through a
    server and the simulator alike). They form the parser's "workload" argument group. A
    simulation reads the same flags with the same meaning; those that only shape what a real
    model does with a request (--prompt-seed, --endpoint, --backend, --prompt-mode,
    --stop-token-ids, --request-seed) change nothing the simulator's stand-in model computes
    and are recorded in its report (docs/lab.md)."""
    g = p.add_argument_group(WORKLOAD_GROUP, "what is sent, when, and how each request ends")
    g.add_argument("--workload", type=workload_spec, default="seed-high",
                   help=f"{' | '.join(workload.WORKLOADS)} | azure:PATH (Azure LLM trace CSV) | "
                        "mooncake:PATH (Mooncake JSONL with hash_ids) | custom:PATH (JSONL of "
                        "{\"prompt\": ...}: real prompts, answers the model ends)")
    g.add_argument("--seed", type=int, default=0, help="workload and prompt seed")
    g.add_argument("--prompt-seed", type=int, default=None,
                   help="prompt seed alone (default: --seed): the same arrivals and "
                        "lengths with other prompts, so a second run misses the prefix cache")
    g.add_argument("--num-prompts", type=int, default=None,
                   help="random: number of requests (default 100); seed-*: keep the first N; "
                        "traces: N rows from --start")
    g.add_argument("--dataset-name", choices=("random", "custom"), default=None,
                   help="vllm bench serve's spelling: --dataset-name custom --dataset-path "
                        "FILE = --workload custom:FILE")
    g.add_argument("--dataset-path", default=None, help="with --dataset-name custom")
    g.add_argument("--start", type=int, default=0,
                   help="traces, custom: first row of the window")
    g.add_argument("--time-scale", type=float, default=1.0,
                   help="traces: multiply the gaps between arrivals (0.5: twice as fast)")
    g.add_argument("--request-rate", type=float, default=float("inf"),
                   help="random, custom: req/s (Poisson; default inf: all at once)")
    g.add_argument("--burstiness", type=float, default=1.0, help="random, custom: gamma shape")
    g.add_argument("--input-len", type=int, default=256, help="random: prompt tokens")
    g.add_argument("--output-len", type=int, default=64, help="random: output tokens")
    g.add_argument("--custom-output-len", type=int, default=prompt_file.CUSTOM_OUTPUT_LEN,
                   help="custom: max_tokens, a cap (the model's EOS ends each answer)")
    g.add_argument("--disable-shuffle", action="store_true",
                   help="custom: the file's order (default: shuffled with --seed)")
    g.add_argument("--length-scale", default="auto",
                   help="seed-*: multiply the report's lengths (auto: context / 32768); "
                        "traces: multiply prompt and output lengths (auto: min(1, context / "
                        "32768))")
    g.add_argument("--output-ratio", type=float, default=0.25,
                   help="seed-*: output tokens per prompt token")
    g.add_argument("--priority", choices=("none", "user", "length"), default=default_priority,
                   help="priority each request carries: by user or by prompt-length bucket")
    g.add_argument("--max-concurrency", type=int, default=None,
                   help="requests in flight at most; the others wait in the client and their "
                        "latencies count from when they are sent")
    g.add_argument("--endpoint", choices=("completions", "chat"), default=None,
                   help="(default: completions)")
    g.add_argument("--backend", choices=tuple(BACKENDS), default=None,
                   help="vllm bench serve's spelling: openai = --endpoint completions, "
                        "openai-chat = --endpoint chat")
    g.add_argument("--prompt-mode", choices=("ids", "text"), default=None,
                   help="send token ids (exact; default for completions) or text (chat)")
    g.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=None,
                   help="--no-ignore-eos: the trace's output length is only max_tokens, "
                        "a cap, and the model's EOS ends each request: output lengths the "
                        "model decides, as length predictors meet them (default: ignore "
                        "EOS, exact lengths; custom:PATH: not)")
    g.add_argument("--stop-token-ids", type=int, nargs="+", default=None, metavar="ID",
                   help="sent with every request (with --no-ignore-eos): e.g. 1 for "
                        "stories260K, which starts a new story with BOS where a story ends")
    g.add_argument("--request-seed", type=int, default=None, metavar="N",
                   help="request i sends seed N + i: sampled outputs repeat across runs "
                        "(default: not sent)")
    g.add_argument("--goodput", nargs="+", default=None, metavar="SLO",
                   help="SLOs in ms, e.g. ttft:500 tpot:50")
    g.add_argument("--output", default="results/bench", help="directory for the report")
    g.add_argument("--disable-tqdm", action="store_true")


def workload_options(p: argparse.ArgumentParser) -> set[str]:
    """The option strings of a parser's workload group (what add_workload_args added)."""
    groups = [g for g in p._action_groups if g.title == WORKLOAD_GROUP]
    return {o for g in groups for a in g._group_actions for o in a.option_strings}


def add_comparison_args(p: argparse.ArgumentParser) -> None:
    """--policies and --length-predictors of `bench policies` / `sim policies`."""
    p.add_argument("--policies", nargs="+", default=["fcfs", "priority", "sjf"],
                   metavar="POLICY", help="policies to compare, space- or comma-separated "
                                          "(default: fcfs priority sjf)")
    p.add_argument("--length-predictors", nargs="+", default=["mean"], metavar="PREDICTOR",
                   help="length predictors to run each policy that ranks by output length "
                        "with (sjf, ...): mean oracle bucket probe (default: mean)")


def _names(values: list[str]) -> list[str]:
    return list(dict.fromkeys(n.strip() for v in values for n in v.split(",") if n.strip()))


def comparison_runs(args) -> list[tuple[str, str, str]]:
    """(run name, policy, length predictor) for every policy x predictor: a policy that does
    not rank by output length runs once; runs are named POLICY/PREDICTOR when several
    predictors are compared."""
    from minivllm.core.length_predictor import LENGTH_PREDICTORS
    from minivllm.core.policy import POLICIES

    policies, predictors = _names(args.policies), _names(args.length_predictors)
    if not policies:
        raise SystemExit("--policies is empty")
    if not predictors:
        raise SystemExit("--length-predictors is empty")
    for kind, names, known in (("policy", policies, POLICIES),
                               ("length predictor", predictors, LENGTH_PREDICTORS)):
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(f"unknown {kind} {unknown[0]!r}; known: {', '.join(sorted(known))}")
    args.length_predictors = predictors
    runs = []
    for policy in policies:
        uses = getattr(POLICIES[policy], "uses_length_predictor", True)
        for predictor in predictors if uses else predictors[:1]:
            name = f"{policy}/{predictor}" if uses and len(predictors) > 1 else policy
            runs.append((name, policy, predictor))
    return runs


def workload_spec(value: str) -> str:
    """argparse type of --workload: a built-in name, or a file kind and an existing file."""
    if value in workload.WORKLOADS:
        return value
    try:
        if traces.parse_workload(value) is None:
            raise ValueError(f"unknown workload {value!r}; choose from "
                             f"{', '.join(workload.WORKLOADS)}, azure:PATH, mooncake:PATH, "
                             "custom:PATH")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def trace_args(args) -> dict:
    """The build_trace keywords that come from the workload flags."""
    return dict(seed=args.seed, num_prompts=args.num_prompts, length_scale=args.length_scale,
                output_ratio=args.output_ratio, input_len=args.input_len,
                output_len=args.output_len, request_rate=args.request_rate,
                burstiness=args.burstiness, priority=args.priority, start=args.start,
                time_scale=args.time_scale, custom_output_len=args.custom_output_len,
                shuffle=not args.disable_shuffle)


def describe_trace(trace, length_scale_arg: str) -> str:
    """'workload X: N requests over S s, ...' for the first line a run prints."""
    e = trace.entries
    span = e[-1].send_time if e else 0.0
    auto = ("context / 32768" if trace.workload.startswith("seed-") else "min(1, context / 32768)")
    kind = trace.workload.partition(":")[0]
    scale = "" if kind in ("random", "custom") else f"length scale {trace.length_scale:.4g}" + (
        f" (auto: {auto}), " if length_scale_arg == "auto" else ", ")
    shared = (f", prefix blocks of {trace.prefix_block_tokens} tokens"
              if trace.prefix_block_tokens else "")
    outputs = sum(x.output_tokens for x in e)
    if kind == "custom":  # the model ends each answer; the trace only caps it
        return (f"workload {trace.workload}: {len(e)} requests over {span:.1f} s, buckets "
                f"(prompt-length terciles) short < {trace.buckets[0]:.0f} <= medium <= "
                f"{trace.buckets[1]:.0f} < long, {sum(x.prompt_tokens for x in e)} prompt "
                f"tokens, answers capped at {max(x.output_tokens for x in e)} tokens "
                f"({trace.num_capped} capped lower to fit the context)")
    return (f"workload {trace.workload}: {len(e)} requests over {span:.1f} s, {scale}"
            f"buckets short < {trace.buckets[0]:.0f} <= medium <= {trace.buckets[1]:.0f} < long, "
            f"{sum(x.prompt_tokens for x in e)} prompt + {outputs} output "
            f"tokens, {trace.num_capped} prompts cut to fit the context{shared}")


def is_custom(args) -> bool:
    return args.workload.startswith("custom:")


def resolve_workload(args) -> None:
    """vLLM's --dataset-name / --dataset-path as --workload, and what a prompt file changes:
    chat by default, answers the model ends (no ignore_eos) sampled at temperature 0.7."""
    if args.dataset_name == "custom":
        if not args.dataset_path:
            raise SystemExit("--dataset-name custom needs --dataset-path FILE")
        try:
            args.workload = workload_spec(f"custom:{args.dataset_path}")
        except argparse.ArgumentTypeError as e:
            raise SystemExit(f"--dataset-path: {e}") from None
    elif args.dataset_name == "random":
        args.workload = "random"
    elif args.dataset_path:
        raise SystemExit("--dataset-path needs --dataset-name custom")
    if args.ignore_eos is None:
        args.ignore_eos = not is_custom(args)
    if is_custom(args):
        # (a command without sampling flags, minivllm sim, has no temperature to set)
        if getattr(args, "temperature", 0) is None:
            args.temperature = CUSTOM_TEMPERATURE
        if args.endpoint is None and args.backend is None:
            args.endpoint = "chat"


def resolve_endpoint(args) -> None:
    """The workload (resolve_workload: every bench command calls this first), then --backend
    (vllm bench serve's name) and --endpoint: one endpoint, or an error."""
    resolve_workload(args)
    from_backend = BACKENDS[args.backend] if args.backend else None
    if from_backend and args.endpoint and from_backend != args.endpoint:
        raise SystemExit(f"--backend {args.backend} contradicts --endpoint {args.endpoint}")
    args.endpoint = args.endpoint or from_backend or "completions"
