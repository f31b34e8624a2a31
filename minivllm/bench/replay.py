"""One replay of a workload against a running server: resolve its model and context, build the
trace and its prompts (prepare), send them and write the run's report (measure)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp

from minivllm.bench import (
    client,
    metrics,
    prediction,
    prompt_file,
    prompts,
    report,
    server_metrics,
    traces,
)
from minivllm.bench.args import describe_trace, trace_args
from minivllm.bench.sampling import describe, sampling_fields
from minivllm.bench.timeline_html import record_engine_events, write_run_timeline


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
        counts = None
        if args.workload.startswith("custom:"):  # real prompts: their lengths, tokenized
            rows = prompt_file.read_custom(args.workload.partition(":")[2])
            counts = [len(await tok.encode(text)) for text in rows]
        trace = traces.build_trace(args.workload, max_model_len=ctx, prompt_tokens=counts,
                                   **trace_args(args))
        mode = args.prompt_mode or ("text" if args.endpoint == "chat" else "ids")
        prompt_seed = args.seed if args.prompt_seed is None else args.prompt_seed
        texts, counts = await prompts.build_prompts(trace, tok, mode, prompt_seed)
    source = "from the file" if args.workload.startswith("custom:") else f"as {mode}"
    print(f"{describe_trace(trace, args.length_scale)}, model {model}, "
          f"context {ctx or 'unknown (2048 assumed)'}, prompts {source}, "
          f"{describe(sampling_fields(args))}")
    return trace, texts, counts, model, ctx


def measure(args, trace, texts, counts, base_url: str, model: str, out_dir: Path, title: str,
            send_priority: bool = True, oracle_lengths: list[int] | None = None,
            prediction_log: str | None = None) -> tuple[dict, list]:
    """Replay the trace; `prediction_log`: the server's --length-prediction-log, whose lines
    this run adds give the predictor's ranking quality and the longest queue wait. The
    server's /metrics, read before and after, give its recompute tax and shed counts."""
    sampling = sampling_fields(args)
    log_start = Path(prediction_log).stat().st_size if (
        prediction_log and Path(prediction_log).exists()) else 0
    counters_before = server_metrics.scrape(base_url)
    (results, duration), engine_events = asyncio.run(record_engine_events(client.run_trace(
        trace, texts, counts, base_url, model, endpoint=args.endpoint,
        max_concurrency=args.max_concurrency, send_priority=send_priority,
        progress=not args.disable_tqdm, sampling=sampling, ignore_eos=args.ignore_eos,
        request_seed=args.request_seed, oracle_lengths=oracle_lengths,
        stop_token_ids=args.stop_token_ids), base_url))
    summary = metrics.summarize(results, duration, trace.buckets, metrics.parse_goodput(args.goodput))
    # The recompute tax and shed counts of this run; None from a server that is not minivllm.
    summary["server_metrics"] = server_metrics.over_run(counters_before,
                                                        server_metrics.scrape(base_url))
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
