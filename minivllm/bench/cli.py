"""`minivllm bench`: the argument parsers of `bench serve` (replay a workload against a server),
`bench policies` (compare_policies.py), `bench sweep` (sweep.py) and `bench throughput`
(offline), and the first and last of them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from minivllm.bench import metrics, prediction, report, sweep
from minivllm.bench.args import add_comparison_args, add_workload_args, resolve_endpoint
from minivllm.bench.compare_policies import run_policies
from minivllm.bench.replay import measure, prepare
from minivllm.bench.sampling import add_sampling_args, describe, sampling_fields
from minivllm.bench.server_process import SKIPPED_ENGINE_ARGS
from minivllm.entrypoints.engine_args import add_engine_args


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
    add_sampling_args(pol, greedy=True)  # docs/lab.md's policy table was measured greedy
    pol.set_defaults(temperature=None)  # run_policies: 0, or 0.7 for a custom:PATH workload
    add_engine_args(pol, skip=SKIPPED_ENGINE_ARGS)
    pol.set_defaults(func=run_policies)
    sweep.add_parser(sub)
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
                          **{k: v for k, v in config.to_kwargs().items() if k != "model"})
    sampling = describe(fields).replace("the server's", "the model's")
    print(f"{result.num_requests} requests, {result.input_len} in / {result.output_len} out, "
          f"{sampling}: "
          f"{result.elapsed_s:.2f} s, {result.output_tokens_per_s:.1f} output tok/s, "
          f"{result.total_tokens_per_s:.1f} total tok/s")
    return 0


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
