"""Reports: a JSON file with every request and the aggregates, markdown tables and PNG plots.

One run writes run.json, summary.md, ttft_cdf.png and buckets.png. A simulated run (`minivllm
sim`) names "simulated" and its cost model in every title and adds the engine-side figures. A policy comparison writes
comparison.json, comparison.md (the seed report's table, policy x bucket, plus a text of what
changed against the first policy), comparison_ttft_cdf.png and comparison_buckets.png.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from minivllm.bench import server_metrics  # noqa: E402
from minivllm.bench.metrics import BUCKETS, TTFT_PARTS, bucket_of, tpot_ms  # noqa: E402


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _rate(tpot: float | None) -> float | None:
    return 1000 / tpot if tpot else None


def bucket_label(name: str, thresholds) -> str:
    t1, t2 = (round(t) for t in thresholds)
    return {"short": f"short (< {t1})", "medium": f"medium ({t1}-{t2})", "long": f"long (> {t2})"}[name]


ENGINE_HEADER = ("| simulated wall time (s) | steps | prefix cache hit rate | preemptions (swap / "
                 "recompute) | peak KV usage | peak running / waiting | recompute tax |")
ENGINE_COLUMNS = ENGINE_HEADER.count("|") - 1


def engine_row(engine: dict) -> str:
    """A simulated run's engine-side figures (what a real run shows only in its metrics)."""
    rate = engine["prefix_cache_hit_rate"]
    return (f"| {engine['simulated_wall_time_s']:.1f} | {engine['num_steps']} | "
            f"{'-' if rate is None else f'{rate:.1%}'} | {engine['preemptions']['swap']} / "
            f"{engine['preemptions']['recompute']} | {engine['peak_kv_usage']:.1%} | "
            f"{engine['peak_num_running']} / {engine['peak_num_waiting']} | "
            f"{engine['recompute_tax']:.2%} |")


def plot_label(meta: dict) -> str:
    """' (simulated, COST MODEL)' on a simulated run's plots, else nothing."""
    return f" ({meta['simulated']})" if meta.get("simulated") else ""


def markdown_summary(summary: dict, title: str = "Run") -> str:
    s = summary
    lines = [f"## {title}", "",
             f"requests {s['total']}: completed {s['completed']}, failed {s['failed']}, "
             f"output length != requested {s['output_length_mismatches']}; "
             f"duration {s['duration_s']:.1f} s", "",
             f"throughput {s['request_throughput']:.2f} req/s, "
             f"{s['output_token_throughput']:.1f} output tok/s, "
             f"{s['total_token_throughput']:.1f} total tok/s"
             + (f"; goodput {s['goodput']:.2f} req/s under {s['slos_ms']} ms"
                if s["goodput"] is not None else ""), "",
             "| metric | mean | median | p90 | p99 |", "|---|---|---|---|---|"]
    for key, name in (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("itl_ms", "ITL (ms)"),
                      ("e2el_ms", "E2E (ms)"), ("output_tokens_per_s", "output tok/s")):
        d = s[key]
        lines.append(f"| {name} | " + " | ".join(_f(d[k]) for k in ("mean", "median", "p90", "p99"))
                     + " |")
    lines += ["", "| bucket (prompt tokens) | requests | failed | mean prompt len | TTFT (s) "
              "| TPOT (ms/token) | 1000/TPOT (tok/s) | output/E2E (tok/s) |",
              "|---|---|---|---|---|---|---|---|"]
    for name in BUCKETS:
        b = s["buckets"][name]
        lines.append(f"| {bucket_label(name, s['bucket_thresholds'])} | {b['requests']} | "
                     f"{b['failed']} | {_f(b['mean_prompt_tokens'])} | "
                     f"{_f(b['ttft_ms']['mean'] and b['ttft_ms']['mean'] / 1000, 3)} | "
                     f"{_f(b['tpot_ms']['mean'], 2)} | {_f(_rate(b['tpot_ms']['mean']))} | "
                     f"{_f(b['output_tokens_per_s']['mean'])} |")
    if "server_metrics" in s:  # a run against a server (absent from simulated runs)
        lines += ["", server_metrics.describe(s["server_metrics"])]
    lines += ttft_split_table(s)
    if s.get("engine"):
        lines += ["", ENGINE_HEADER, "|---" * ENGINE_COLUMNS + "|", engine_row(s["engine"])]
    return "\n".join(lines) + "\n"


def ttft_split_table(s: dict) -> list[str]:
    """Where the TTFT went, per bucket and over all, where the server said (minivllm's
    `timing`): mean ms of each part, which add up to the mean TTFT of those requests."""
    rows = [("all", s.get("ttft_split"))] + [
        (bucket_label(name, s["bucket_thresholds"]), s["buckets"][name].get("ttft_split"))
        for name in BUCKETS]
    if all(split is None for _, split in rows):
        return []
    lines = ["", "Where the TTFT went (mean ms; the server's `timing`, HTTP = the client's TTFT "
                 "minus the server's):", "",
             "| bucket | requests | TTFT | frontend in | queue | prefill | frontend out | HTTP "
             "| prefill steps | tokens in those steps |", "|---" * 10 + "|"]
    for label, split in rows:
        if split is None:
            continue
        p = split["parts_ms"]
        lines.append(f"| {label} | {split['requests']} | {split['ttft_ms']:.1f} | "
                     + " | ".join(f"{p[part]:.1f}" for part in TTFT_PARTS)
                     + f" | {split['prefill_steps']:.1f} | {split['prefill_step_tokens']:.0f} |")
    return lines


def request_rows(results: list, thresholds) -> list[dict]:
    return [{**asdict(r), "bucket": bucket_of(r.prompt_tokens, thresholds), "tpot_ms": tpot_ms(r)}
            for r in results]


def _ttft_cdf(ax, results: list, label: str | None = None) -> None:
    ttfts = sorted(r.ttft for r in results if r.success)
    ax.step(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], where="post", label=label)
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_run(out_dir: str | Path, meta: dict, results: list, summary: dict) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    th = summary["bucket_thresholds"]
    doc = {"meta": meta, "summary": summary, "requests": request_rows(results, th)}
    (out / "run.json").write_text(json.dumps(doc, indent=1))
    (out / "summary.md").write_text(markdown_summary(summary, meta.get("title", "Run")))
    fig, ax = plt.subplots(figsize=(6, 4))
    _ttft_cdf(ax, results)
    ax.set_title("TTFT CDF" + plot_label(meta))
    paths = [out / "run.json", out / "summary.md", _save(fig, out / "ttft_cdf.png")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = (("TTFT (s)", lambda r: r.ttft), ("TPOT (ms/token)", tpot_ms))
    for ax, (label, value) in zip(axes, panels, strict=True):
        groups = [[v for r in results if r.success and bucket_of(r.prompt_tokens, th) == b
                   and (v := value(r)) is not None] for b in BUCKETS]
        ax.boxplot([g or [float("nan")] for g in groups], showfliers=False)
        ax.set_xticks(range(1, 4), [f"{b}\n(n={len(g)})" for b, g in zip(BUCKETS, groups,
                                                                          strict=True)])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle("by prompt-length bucket" + plot_label(meta))
    return paths + [_save(fig, out / "buckets.png")]


def describe_changes(summaries: dict[str, dict]) -> str:
    """What changed per bucket, each policy against the first one, and who did best."""
    names = list(summaries)
    base = names[0]
    lines = []

    def mean(policy: str, bucket: str, key: str) -> float | None:
        return summaries[policy]["buckets"][bucket][key]["mean"]

    def pct(new: float, old: float) -> str:
        return f"{(new - old) / old * 100:+.0f}%" if old else "n/a"

    for name in names[1:]:
        parts = []
        for b in BUCKETS:
            t0, t1 = mean(base, b, "ttft_ms"), mean(name, b, "ttft_ms")
            p0, p1 = mean(base, b, "tpot_ms"), mean(name, b, "tpot_ms")
            if None in (t0, t1):
                continue
            text = f"{b} TTFT {t0 / 1000:.3g} -> {t1 / 1000:.3g} s ({pct(t1, t0)})"
            if None not in (p0, p1):
                text += f", TPOT {p0:.3g} -> {p1:.3g} ms ({pct(p1, p0)})"
            parts.append(text)
        s0, s1 = summaries[base], summaries[name]
        parts.append(f"failed {s0['failed']} -> {s1['failed']}, "
                     f"duration {s0['duration_s']:.1f} -> {s1['duration_s']:.1f} s")
        lines.append(f"- {name} vs {base}: " + "; ".join(parts) + ".")
    for key, label in (("ttft_ms", "lowest mean TTFT"), ("tpot_ms", "lowest mean TPOT")):
        best = []
        for b in BUCKETS:
            scored = [(mean(p, b, key), p) for p in names if mean(p, b, key) is not None]
            if scored:
                best.append(f"{b}: {min(scored)[1]}")
        lines.append(f"- {label}: " + ", ".join(best) + ".")
    return "\n".join(lines) + "\n"


def _per_user(rates: dict[str, float]) -> str:
    """Output tok/s per user: each one up to 4 users, else the range."""
    if len(rates) < 2:
        return "-"
    if len(rates) <= 4:
        return ", ".join(f"{u}: {v:.1f}" for u, v in rates.items())
    return f"{min(rates.values()):.1f}-{max(rates.values()):.1f} ({len(rates)} users)"


def policy_table(summaries: dict[str, dict]) -> str:
    """One row per run (policy, or policy/predictor): goodput, mean E2E and TTFT, p99 TTFT,
    short requests' mean TTFT, the longest queue wait, the length predictor's Kendall tau and
    MAE, the recompute tax where the run counted it, the prefix cache's hit rate where the
    simulator counted it, output tok/s per user where users send several requests each."""
    s0 = next(iter(summaries.values()))
    def tax_of(s):  # the simulator's engine figures, or a server's /metrics (bench)
        return (s.get("engine") or s.get("server_metrics") or {}).get("recompute_tax")

    tax = any(tax_of(s) is not None for s in summaries.values())

    def hit_rate_of(s):  # the simulator's engine figures
        return s.get("engine", {}).get("prefix_cache_hit_rate")

    hits = any(hit_rate_of(s) is not None for s in summaries.values())
    users = any(1 < len(s.get("per_user_output_tokens_per_s") or {}) <= s["completed"] / 2
                for s in summaries.values())  # tenants: users with several requests each
    slos = s0.get("slos_ms") or {}
    good = "goodput (req/s" + (", " + " ".join(f"{k}:{v:g}" for k, v in slos.items())
                               if slos else "") + ")"
    head = ["run", "completed", good, "mean E2E (s)", "mean TTFT (s)", "p99 TTFT (s)",
            "short-request mean TTFT (s)", "max queue (s)", "Kendall tau", "MAE (tokens)"]
    head += (["recompute tax"] * tax + ["prefix cache hit rate"] * hits
             + ["output tok/s per user"] * users)
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]

    def sec(ms):
        return _f(ms and ms / 1000, 3)

    for name, s in summaries.items():
        q = s.get("length_prediction") or {}
        tau = q.get("kendall_tau")
        row = [name, str(s["completed"]), _f(s["goodput"], 2) if slos else "-",
               sec(s["e2el_ms"]["mean"]), sec(s["ttft_ms"]["mean"]), sec(s["ttft_ms"]["p99"]),
               sec((s.get("short_requests") or {}).get("ttft_ms", {}).get("mean")),
               _f(s.get("max_queue_s"), 3), "-" if tau is None else f"{tau:.3f}",
               _f(q.get("mae"))]
        if tax:
            share = tax_of(s)
            row.append("-" if share is None else f"{share:.2%}")
        if hits:
            rate = hit_rate_of(s)
            row.append("-" if rate is None else f"{rate:.1%}")
        if users:
            row.append(_per_user(s.get("per_user_output_tokens_per_s") or {}))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def comparison_markdown(summaries: dict[str, dict], title: str) -> str:
    first = next(iter(summaries.values()))
    lines = [f"# {title}", "", policy_table(summaries),
             "Short requests: the quarter with the fewest prompt + output tokens. Max queue: "
             "the longest wait from sent to first scheduled. Kendall tau and MAE: the length "
             "predictor's predictions against the true output lengths.", ""]
    for b in BUCKETS:
        lines += [f"### {bucket_label(b, first['bucket_thresholds'])} prompt tokens", "",
                  "| policy | requests | failed | mean prompt len | TTFT (s) | TPOT (ms/token) "
                  "| 1000/TPOT (tok/s) | output/E2E (tok/s) |", "|---|---|---|---|---|---|---|---|"]
        for policy, s in summaries.items():
            x = s["buckets"][b]
            ttft = x["ttft_ms"]["mean"]
            lines.append(f"| {policy} | {x['requests']} | {x['failed']} | "
                         f"{_f(x['mean_prompt_tokens'])} | {_f(ttft and ttft / 1000, 3)} | "
                         f"{_f(x['tpot_ms']['mean'], 2)} | {_f(_rate(x['tpot_ms']['mean']))} | "
                         f"{_f(x['output_tokens_per_s']['mean'])} |")
        lines.append("")
    if all(s.get("engine") for s in summaries.values()):
        lines += ["### Engine side (simulated)", "", "| policy " + ENGINE_HEADER,
                  "|---" * (ENGINE_COLUMNS + 1) + "|"]
        lines += [f"| {policy} " + engine_row(s["engine"]) for policy, s in summaries.items()]
        lines.append("")
    lines += ["## What changed", "", describe_changes(summaries)]
    return "\n".join(lines)


def write_comparison(out_dir: str | Path, meta: dict, runs: dict[str, tuple[dict, list]]
                     ) -> list[Path]:
    """runs: policy -> (summary, results), in the order to show (the first is the baseline)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = {p: s for p, (s, _) in runs.items()}
    (out / "comparison.json").write_text(json.dumps({"meta": meta, "summaries": summaries},
                                                    indent=1))
    (out / "comparison.md").write_text(comparison_markdown(summaries, meta.get("title", "Policies")))
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, (_, results) in runs.items():
        _ttft_cdf(ax, results, policy)
    ax.legend()
    ax.set_title("TTFT CDF by policy" + plot_label(meta))
    paths = [out / "comparison.json", out / "comparison.md",
             _save(fig, out / "comparison_ttft_cdf.png")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(runs)
    for ax, key, label, k in ((axes[0], "ttft_ms", "mean TTFT (s)", 1000),
                              (axes[1], "tpot_ms", "mean TPOT (ms/token)", 1)):
        for i, (policy, s) in enumerate(summaries.items()):
            vals = [(s["buckets"][b][key]["mean"] or 0) / k for b in BUCKETS]
            ax.bar([j + i * width for j in range(3)], vals, width, label=policy)
        ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(3)], BUCKETS)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend()
    fig.suptitle("policies side by side, by prompt-length bucket" + plot_label(meta))
    return paths + [_save(fig, out / "comparison_buckets.png")]
