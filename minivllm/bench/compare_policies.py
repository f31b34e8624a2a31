"""`minivllm bench policies`: one minivllm server per scheduling policy (x length predictor),
the same trace and prompts against each, and a comparison report."""

from __future__ import annotations

import asyncio
from pathlib import Path

from minivllm.bench import metrics, prediction, report
from minivllm.bench.args import comparison_runs, resolve_endpoint
from minivllm.bench.replay import measure, prepare
from minivllm.bench.sampling import sampling_fields
from minivllm.bench.server_process import (
    engine_flags,
    free_port,
    server_command,
    start_server,
    stop_server,
)


def run_policies(args) -> int:
    combos = comparison_runs(args)
    policies = list(dict.fromkeys(p for _, p, _ in combos))
    metrics.parse_goodput(args.goodput)
    resolve_endpoint(args)  # custom:PATH sets temperature 0.7 where none was given
    if args.temperature is None:
        args.temperature = 0.0  # docs/lab.md's policy table was measured greedy
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
        proc, _ = start_server(cmd, log, base_url, args.server_timeout)
        try:
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
    with open(out / "comparison.md", "a") as f:
        f.write(held_out_markdown(runs))
    print((out / "comparison.md").read_text())
    print(f"report written to {out}/")
    return 0


def held_out_markdown(runs: dict) -> str:
    """Each run's predictor over every request and over the second half in finish order
    (prediction.quality_from_log's held_out: past an online predictor's cold start)."""
    lines = ["", "### Length prediction: all requests and the second half (held out)", "",
             "| run | n | Kendall tau | MAE (tokens) | held-out n | held-out tau | "
             "held-out MAE | mean true output |", "|---|---|---|---|---|---|---|---|"]

    def f(x, spec):
        return "-" if x is None else format(x, spec)

    for name, (summary, _) in runs.items():
        q = summary.get("length_prediction") or {}
        late = q.get("held_out") or {}
        lines.append(f"| {name} | {q.get('n', 0)} | {f(q.get('kendall_tau'), '.3f')} | "
                     f"{f(q.get('mae'), '.1f')} | {late.get('n', 0)} | "
                     f"{f(late.get('kendall_tau'), '.3f')} | {f(late.get('mae'), '.1f')} | "
                     f"{f(q.get('mean_true'), '.1f')} |")
    return "\n".join(lines) + "\n"
