"""`minivllm bench serve` (replay a workload against a server) and `minivllm bench policies`
(one minivllm server per scheduling policy, the same trace against each, a comparison report)."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import MISSING, fields
from pathlib import Path

import aiohttp

from minivllm.bench import client, metrics, prediction, prompts, report, traces, workload
from minivllm.bench.sampling import add_sampling_args, describe, sampling_fields
from minivllm.bench.timeline_html import record_engine_events, write_run_timeline
from minivllm.config import EngineConfig
from minivllm.entrypoints.engine_args import add_engine_args

SKIPPED_ENGINE_ARGS = ("model", "seed", "scheduling_policy", "tokenizer", "length_predictor",
                       "length_prediction_log")
BACKENDS = {"openai": "completions", "openai-chat": "chat"}


def add_workload_args(p: argparse.ArgumentParser, default_priority: str,
                      server: bool = True) -> None:
    """The workload and report flags; `server=False` (minivllm sim) leaves out those about
    talking to a server."""
    p.add_argument("--workload", type=workload_spec, default="seed-high",
                   help=f"{' | '.join(workload.WORKLOADS)} | azure:PATH (Azure LLM trace CSV) | "
                        "mooncake:PATH (Mooncake JSONL with hash_ids)")
    p.add_argument("--seed", type=int, default=0, help="workload and prompt seed")
    if server:
        p.add_argument("--prompt-seed", type=int, default=None,
                       help="prompt seed alone (default: --seed): the same arrivals and "
                            "lengths with other prompts, so a second run misses the prefix cache")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="random: number of requests (default 100); seed-*: keep the first N; "
                        "traces: N rows from --start")
    p.add_argument("--start", type=int, default=0, help="traces: first row of the window")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="traces: multiply the gaps between arrivals (0.5: twice as fast)")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="random: req/s")
    p.add_argument("--burstiness", type=float, default=1.0, help="random: gamma shape")
    p.add_argument("--input-len", type=int, default=256, help="random: prompt tokens")
    p.add_argument("--output-len", type=int, default=64, help="random: output tokens")
    p.add_argument("--length-scale", default="auto",
                   help="seed-*: multiply the report's lengths (auto: context / 32768); "
                        "traces: multiply prompt and output lengths (auto: min(1, context / "
                        "32768))")
    p.add_argument("--output-ratio", type=float, default=0.25,
                   help="seed-*: output tokens per prompt token")
    p.add_argument("--priority", choices=("none", "user", "length"), default=default_priority,
                   help="priority each request carries: by user or by prompt-length bucket")
    if server:
        p.add_argument("--max-concurrency", type=int, default=None)
        p.add_argument("--endpoint", choices=("completions", "chat"), default=None,
                       help="(default: completions)")
        p.add_argument("--backend", choices=tuple(BACKENDS), default=None,
                       help="vllm bench serve's spelling: openai = --endpoint completions, "
                            "openai-chat = --endpoint chat")
        p.add_argument("--prompt-mode", choices=("ids", "text"), default=None,
                       help="send token ids (exact; default for completions) or text (chat)")
        p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                       help="--no-ignore-eos: the trace's output length is only max_tokens, "
                            "a cap, and the model's EOS ends each request: output lengths the "
                            "model decides, as length predictors meet them (default: ignore "
                            "EOS, exact lengths)")
        p.add_argument("--stop-token-ids", type=int, nargs="+", default=None, metavar="ID",
                       help="sent with every request (with --no-ignore-eos): e.g. 1 for "
                            "stories260K, which starts a new story with BOS where a story ends")
        p.add_argument("--request-seed", type=int, default=None, metavar="N",
                       help="request i sends seed N + i: sampled outputs repeat across runs "
                            "(default: not sent)")
    p.add_argument("--goodput", nargs="+", default=None, metavar="SLO",
                   help="SLOs in ms, e.g. ttft:500 tpot:50")
    p.add_argument("--output", default="results/bench", help="directory for the report")
    p.add_argument("--disable-tqdm", action="store_true")


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
    """argparse type of --workload: a built-in name, or a trace kind and an existing file."""
    if value in workload.WORKLOADS:
        return value
    try:
        if traces.parse_workload(value) is None:
            raise ValueError(f"unknown workload {value!r}; choose from "
                             f"{', '.join(workload.WORKLOADS)}, azure:PATH, mooncake:PATH")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def trace_args(args) -> dict:
    """The build_trace keywords that come from the workload flags."""
    return dict(seed=args.seed, num_prompts=args.num_prompts, length_scale=args.length_scale,
                output_ratio=args.output_ratio, input_len=args.input_len,
                output_len=args.output_len, request_rate=args.request_rate,
                burstiness=args.burstiness, priority=args.priority, start=args.start,
                time_scale=args.time_scale)


def describe_trace(trace, length_scale_arg: str) -> str:
    """'workload X: N requests over S s, ...' for the first line a run prints."""
    e = trace.entries
    span = e[-1].send_time if e else 0.0
    auto = ("context / 32768" if trace.workload.startswith("seed-") else "min(1, context / 32768)")
    scale = "" if trace.workload == "random" else f"length scale {trace.length_scale:.4g}" + (
        f" (auto: {auto}), " if length_scale_arg == "auto" else ", ")
    shared = (f", prefix blocks of {trace.prefix_block_tokens} tokens"
              if trace.prefix_block_tokens else "")
    return (f"workload {trace.workload}: {len(e)} requests over {span:.1f} s, {scale}"
            f"buckets short < {trace.buckets[0]:.0f} <= medium <= {trace.buckets[1]:.0f} < long, "
            f"{sum(x.prompt_tokens for x in e)} prompt + {sum(x.output_tokens for x in e)} output "
            f"tokens, {trace.num_capped} prompts cut to fit the context{shared}")


def add_parser(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="load-test a server; compare scheduling policies")
    sub = bench.add_subparsers(dest="bench_command", required=True)
    serve = sub.add_parser("serve", help="replay a workload against an OpenAI-compatible server")
    serve.add_argument("--base-url", default=None,
                       help="the server's URL (default: http://HOST:PORT)")
    serve.add_argument("--host", default="127.0.0.1", help="(default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000,
                       help="(default: 8000, minivllm serve's and vllm serve's default)")
    serve.add_argument("--model", default=None, help="served model (default: first of /v1/models)")
    serve.add_argument("--tokenizer", default=None,
                       help="local tokenizer.json (or its directory) instead of POST /tokenize")
    serve.add_argument("--max-model-len", type=int, default=None,
                       help="server context (default: from /v1/models or /tokenize)")
    add_workload_args(serve, "none")
    serve.add_argument("--oracle-lengths", action="store_true",
                       help="send each request's trace output length as oracle_output_len "
                            "(a server run with --length-predictor oracle; with ignore-eos)")
    serve.add_argument("--length-prediction-log", default=None, metavar="PATH",
                       help="the server's --length-prediction-log (same machine): report its "
                            "predictor's Kendall tau, error and the longest queue wait over "
                            "the lines this run added")
    add_sampling_args(serve)
    serve.set_defaults(func=run_serve)
    pol = sub.add_parser("policies", help="start a minivllm server per policy; compare them")
    pol.add_argument("--model", required=True, help="model directory or name to serve")
    add_comparison_args(pol)
    pol.add_argument("--server-timeout", type=float, default=600, help="seconds to wait for /health")
    add_workload_args(pol, "length")
    add_sampling_args(pol, greedy=True)  # the README's policy table was measured greedy
    add_engine_args(pol, skip=SKIPPED_ENGINE_ARGS)
    pol.set_defaults(func=run_policies)
    thr = sub.add_parser("throughput", help="offline engine throughput on random prompts")
    thr.add_argument("--num-prompts", type=int, default=64)
    thr.add_argument("--input-len", type=int, default=128)
    thr.add_argument("--output-len", type=int, default=128)
    add_sampling_args(thr)  # absent: the model's defaults (LLM.get_default_sampling_params)
    add_engine_args(thr)
    thr.set_defaults(func=run_throughput)


def run_throughput(args) -> int:
    from minivllm.bench.throughput import run_minivllm
    from minivllm.entrypoints.engine_args import config_from_args

    config = config_from_args(args)
    fields = sampling_fields(args)
    result = run_minivllm(config.model, None, args.output_len, num_prompts=args.num_prompts,
                          input_len=args.input_len, sampling=fields,
                          **{k: v for k, v in vars(config).items() if k != "model"})
    sampling = describe(fields).replace("the server's", "the model's")
    print(f"{result.num_requests} requests, {result.input_len} in / {result.output_len} out, "
          f"{sampling}: "
          f"{result.elapsed_s:.2f} s, {result.output_tokens_per_s:.1f} output tok/s, "
          f"{result.total_tokens_per_s:.1f} total tok/s")
    return 0


async def prepare(args, base_url: str, model: str | None, max_model_len: int | None):
    """Resolve the model and context, build the trace and its prompts; print what was chosen."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        try:
            served, ctx = await client.server_info(session, base_url)
        except (aiohttp.ClientError, RuntimeError, KeyError, IndexError) as e:
            if model is None:
                raise RuntimeError(f"cannot list models at {base_url}: {e}") from e
            served, ctx = model, None
        model = model or served
        tok_path = getattr(args, "tokenizer", None)
        tok = (prompts.LocalTokenizer(tok_path) if tok_path
               else prompts.ServerTokenizer(session, base_url, model))
        if max_model_len is None and ctx is None and not tok_path:
            await tok.encode("hi")
            ctx = tok.max_model_len
        ctx = max_model_len or ctx
        trace = workload.build_trace(args.workload, max_model_len=ctx, **trace_args(args))
        mode = args.prompt_mode or ("text" if args.endpoint == "chat" else "ids")
        prompt_seed = args.seed if args.prompt_seed is None else args.prompt_seed
        texts, counts = await prompts.build_prompts(trace, tok, mode, prompt_seed)
    print(f"{describe_trace(trace, args.length_scale)}, model {model}, "
          f"context {ctx or 'unknown (2048 assumed)'}, prompts as {mode}, "
          f"{describe(sampling_fields(args))}")
    return trace, texts, counts, model, ctx


def measure(args, trace, texts, counts, base_url: str, model: str, out_dir: Path, title: str,
            send_priority: bool = True, oracle_lengths: list[int] | None = None,
            prediction_log: str | None = None) -> tuple[dict, list]:
    """Replay the trace; `prediction_log`: the server's --length-prediction-log, whose lines
    this run adds give the predictor's ranking quality and the longest queue wait."""
    sampling = sampling_fields(args)
    log_start = Path(prediction_log).stat().st_size if (
        prediction_log and Path(prediction_log).exists()) else 0
    (results, duration), engine_events = asyncio.run(record_engine_events(client.run_trace(
        trace, texts, counts, base_url, model, endpoint=args.endpoint,
        max_concurrency=args.max_concurrency, send_priority=send_priority,
        progress=not args.disable_tqdm, sampling=sampling, ignore_eos=args.ignore_eos,
        request_seed=args.request_seed, oracle_lengths=oracle_lengths,
        stop_token_ids=args.stop_token_ids), base_url))
    summary = metrics.summarize(results, duration, trace.buckets, metrics.parse_goodput(args.goodput))
    if prediction_log:
        rows = prediction.read_prediction_log(prediction_log, start=log_start)
        q = prediction.quality_from_log(rows)
        summary["max_queue_s"] = q.pop("max_queue_s")
        summary["length_prediction"] = q
    meta = {"title": title, "base_url": base_url, "model": model, "workload": trace.workload,
            "seed": args.seed, "length_scale": trace.length_scale, "endpoint": args.endpoint,
            "max_concurrency": args.max_concurrency, "priority": args.priority,
            "priority_sent": send_priority, "sampling": sampling,
            "prompt_seed": args.prompt_seed, "ignore_eos": args.ignore_eos,
            "request_seed": args.request_seed, "oracle_lengths_sent": oracle_lengths is not None,
            "stop_token_ids": args.stop_token_ids,
            "argv": sys.argv[1:]}
    report.write_run(out_dir, meta, results, summary)
    write_run_timeline(out_dir, title, results, engine_events)
    return summary, results


def resolve_endpoint(args) -> None:
    """--backend (vllm bench serve's name) and --endpoint: one endpoint, or an error."""
    from_backend = BACKENDS[args.backend] if args.backend else None
    if from_backend and args.endpoint and from_backend != args.endpoint:
        raise SystemExit(f"--backend {args.backend} contradicts --endpoint {args.endpoint}")
    args.endpoint = args.endpoint or from_backend or "completions"


def run_serve(args) -> int:
    metrics.parse_goodput(args.goodput)  # fail on a bad SLO before any work
    resolve_endpoint(args)
    args.base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    trace, texts, counts, model, _ = asyncio.run(
        prepare(args, args.base_url, args.model, args.max_model_len))
    title = (f"{trace.workload} (seed {args.seed}) against {model}, "
             f"{describe(sampling_fields(args))}")
    oracle = [e.output_tokens for e in trace.entries] if args.oracle_lengths else None
    summary, _ = measure(args, trace, texts, counts, args.base_url, model, Path(args.output),
                         title, oracle_lengths=oracle,
                         prediction_log=args.length_prediction_log)
    print(report.markdown_summary(summary, title))
    if args.length_prediction_log:
        print(f"length prediction: {prediction.describe(summary['length_prediction'])}; "
              f"longest queue wait {summary['max_queue_s']} s")
    print(f"report written to {args.output}/")
    return 1 if summary["completed"] == 0 else 0


def engine_flags(args) -> list[str]:
    """The engine flags given to `bench policies` that differ from their defaults, for serve."""
    flags = []
    for f in fields(EngineConfig):
        value = getattr(args, f.name, None)
        if f.name in SKIPPED_ENGINE_ARGS or value is None or value == f.default or f.default is MISSING:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict):  # --override-generation-config
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def server_command(model: str, port: int, policy: str, flags: list[str],
                   length_predictor: str = "mean", prediction_log: Path | None = None
                   ) -> list[str]:
    cmd = [sys.executable, "-m", "minivllm.entrypoints.cli", "serve", model, "--host",
           "127.0.0.1", "--port", str(port), "--scheduling-policy", policy,
           "--length-predictor", length_predictor, *flags]
    return cmd + (["--length-prediction-log", str(prediction_log)] if prediction_log else [])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base_url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"server exited with code {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server at {base_url} not healthy after {timeout:.0f} s; see {log}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def scrape_recompute_tax(base_url: str) -> float | None:
    """The server's recompute tax from /metrics (its counters since it started), or None
    where it does not count one."""
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    totals = {}
    for line in text.splitlines():
        for name in ("minivllm:num_recomputed_tokens_total", "minivllm:num_computed_tokens_total"):
            if line.startswith(name + "{") or line.startswith(name + " "):
                totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    computed = totals.get("minivllm:num_computed_tokens_total")
    if computed is None or "minivllm:num_recomputed_tokens_total" not in totals:
        return None
    return totals["minivllm:num_recomputed_tokens_total"] / computed if computed else 0.0


def run_policies(args) -> int:
    combos = comparison_runs(args)
    policies = list(dict.fromkeys(p for _, p, _ in combos))
    metrics.parse_goodput(args.goodput)
    resolve_endpoint(args)
    # Oracle runs send each request's true output length: the trace's under --ignore-eos;
    # else the model decides, so they run last and send what an earlier run generated, with
    # per-request seeds so that sampling repeats (greedy repeats anyway).
    combos.sort(key=lambda c: c[2] == "oracle")
    if not args.ignore_eos and any(c[2] == "oracle" for c in combos):
        if all(c[2] == "oracle" for c in combos):
            raise SystemExit("with --no-ignore-eos an oracle run needs an earlier run's output "
                             "lengths: add a non-oracle run (e.g. --policies fcfs sjf)")
        if args.request_seed is None:
            args.request_seed = 0
            print("oracle runs with --no-ignore-eos: sending per-request seeds "
                  "(--request-seed 0) so outputs repeat across runs")
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    flags, runs, prepared, generated = engine_flags(args), {}, None, None
    for name, policy, predictor in combos:
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        run_dir = out / name.replace("/", "-")
        run_dir.mkdir(parents=True, exist_ok=True)
        predictions = run_dir / "predictions.jsonl"
        predictions.unlink(missing_ok=True)
        log = out / f"server-{name.replace('/', '-')}.log"
        cmd = server_command(args.model, port, policy, flags, predictor, predictions)
        print(f"[{name}] starting: {' '.join(cmd)}")
        with open(log, "w") as log_file:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
            try:
                wait_healthy(base_url, proc, args.server_timeout, log)
                if prepared is None:  # the same trace and prompts for every policy
                    prepared = asyncio.run(prepare(args, base_url, None, args.max_model_len))
                trace, texts, counts, model, _ = prepared
                oracle = None
                if predictor == "oracle" and not args.ignore_eos and generated is None:
                    raise SystemExit("no earlier run completed every request: no output "
                                     "lengths for the oracle")
                if predictor == "oracle":
                    oracle = ([e.output_tokens for e in trace.entries] if args.ignore_eos
                              else [max(1, n) for n in generated])
                title = f"{trace.workload} (seed {args.seed}), policy {name}"
                runs[name] = measure(args, trace, texts, counts, base_url, model, run_dir,
                                     title, send_priority=policy == "priority",
                                     oracle_lengths=oracle, prediction_log=str(predictions))
                tax = scrape_recompute_tax(base_url)
                runs[name][0]["recompute_tax"] = tax  # the server's, from /metrics
                if generated is None and all(r.success for r in runs[name][1]):
                    generated = [r.output_tokens for r in runs[name][1]]
                print(report.markdown_summary(runs[name][0], title))
                print(f"[{name}] length predictor {predictor}: "
                      f"{prediction.describe(runs[name][0]['length_prediction'])}")
            finally:
                stop_server(proc)
    trace, model = prepared[0], prepared[3]
    meta = {"title": f"Policies on {trace.workload} (seed {args.seed}, length scale "
                     f"{trace.length_scale:.4g}, model {model})",
            "policies": policies, "length_predictors": args.length_predictors,
            "runs": list(runs), "engine_flags": flags, "workload": trace.workload,
            "seed": args.seed, "length_scale": trace.length_scale, "priority": args.priority,
            "ignore_eos": args.ignore_eos, "request_seed": args.request_seed,
            "sampling": sampling_fields(args)}
    report.write_comparison(out, meta, runs)
    print((out / "comparison.md").read_text())
    print(f"report written to {out}/")
    return 0
