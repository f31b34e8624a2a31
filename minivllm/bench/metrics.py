"""Pure metric math over request results (times in seconds in, milliseconds out).

TTFT: sent -> first token. TPOT = (E2E - TTFT) / (output tokens - 1). ITL: every gap between
token arrivals. E2E: sent -> last token. Output tokens/s per request = output tokens / E2E, the
seed report's "TPOT (token/s)". Throughputs divide by the replay's wall time. Goodput counts the
requests per second that succeeded within every SLO given (`ttft:MS tpot:MS e2el:MS`), as
`vllm bench serve` does. Buckets follow the report: short < t1 <= medium <= t2 < long prompt
tokens, with (t1, t2) = (500, 5000) times the workload's length scale.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

BUCKETS = ("short", "medium", "long")


def distribution(values: Iterable[float]) -> dict[str, float | None]:
    v = np.asarray(list(values), dtype=float)
    if v.size == 0:
        return {"mean": None, "median": None, "p90": None, "p99": None}
    return {"mean": float(v.mean()), "median": float(np.median(v)),
            "p90": float(np.percentile(v, 90)), "p99": float(np.percentile(v, 99))}


def tpot_ms(r) -> float | None:
    if not r.success or r.output_tokens < 2:
        return None
    return (r.e2e - r.ttft) / (r.output_tokens - 1) * 1000


def tokens_per_s(r) -> float | None:
    return r.output_tokens / r.e2e if r.success and r.e2e > 0 else None


def bucket_of(prompt_tokens: int, thresholds: tuple[float, float]) -> str:
    if prompt_tokens < thresholds[0]:
        return "short"
    return "medium" if prompt_tokens <= thresholds[1] else "long"


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """["ttft:500", "tpot:50"] -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    slos = {}
    for item in items or []:
        name, sep, value = item.partition(":")
        if not sep or name not in ("ttft", "tpot", "e2el") or float(value) <= 0:
            raise ValueError(f"goodput SLO must be ttft:MS, tpot:MS or e2el:MS, got {item!r}")
        slos[name] = float(value)
    return slos


def is_good(r, slos: dict[str, float]) -> bool:
    if not r.success:
        return False
    measured = {"ttft": r.ttft * 1000, "tpot": tpot_ms(r) or 0.0, "e2el": r.e2e * 1000}
    return all(measured[name] <= limit for name, limit in slos.items())


# The parts of TTFT a minivllm server reports (its `timing`), in order, and the rest: the
# HTTP transfer both ways, which the client measures as its TTFT minus the server's.
TTFT_PARTS = ("frontend_in", "queue", "prefill", "frontend_out", "http")


def ttft_split(done: list) -> dict | None:
    """Mean milliseconds of each TTFT part over the requests whose server said (means, so
    that the parts add up to the mean TTFT of those requests), with the mean prefill steps
    and the tokens those steps computed; None when no server timing came back."""
    timed = [r for r in done if r.server_timing]
    if not timed:
        return None
    n = len(timed)
    parts = {}
    for part in TTFT_PARTS[:-1]:
        parts[part] = sum(r.server_timing[f"{part}_s"] for r in timed) / n * 1000
    parts["http"] = sum(r.ttft - r.server_timing["server_ttft_s"] for r in timed) / n * 1000
    return {"requests": n, "ttft_ms": sum(r.ttft for r in timed) / n * 1000,
            "parts_ms": parts,
            "prefill_steps": sum(r.server_timing["prefill_steps"] for r in timed) / n,
            "prefill_step_tokens": sum(r.server_timing["prefill_step_tokens"]
                                       for r in timed) / n}


def _latencies(done: list) -> dict[str, dict]:
    return {
        "ttft_split": ttft_split(done),
        "ttft_ms": distribution(r.ttft * 1000 for r in done),
        "tpot_ms": distribution(t for r in done if (t := tpot_ms(r)) is not None),
        "itl_ms": distribution(x * 1000 for r in done for x in r.itl),
        "e2el_ms": distribution(r.e2e * 1000 for r in done),
        "output_tokens_per_s": distribution(tokens_per_s(r) for r in done),
    }


def policy_figures(results: list, done: list, duration: float) -> dict:
    """What a policy comparison reads beside latencies: the mean TTFT of short requests (the
    quarter with the fewest prompt + output tokens: what shortest-first ordering is for), the
    longest wait before first scheduled (where the engine side says), output tokens per second
    per user, and the length predictor's ranking quality (bench/prediction.py)."""
    from minivllm.bench.prediction import quality

    work = sorted(done, key=lambda r: r.prompt_tokens + r.output_tokens)
    short = work[:max(1, len(work) // 4)] if work else []
    queue = [r.queue_s for r in done if r.queue_s is not None]
    users: dict[str, int] = {}
    for r in done:
        users[str(r.user)] = users.get(str(r.user), 0) + r.output_tokens
    return {
        "short_requests": {"requests": len(short),
                           "ttft_ms": distribution(r.ttft * 1000 for r in short)},
        "max_queue_s": max(queue) if queue else None,
        "per_user_output_tokens_per_s": {u: n / duration for u, n in sorted(users.items())},
        "length_prediction": quality([r.predicted_output_tokens for r in done],
                                     [r.output_tokens for r in done]),
    }


def summarize(results: list, duration: float, thresholds: tuple[float, float],
              slos: dict[str, float] | None = None) -> dict:
    done = [r for r in results if r.success]
    duration = max(duration, 1e-9)
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens for r in done)
    summary = {
        "total": len(results),
        "completed": len(done),
        "failed": len(results) - len(done),
        "output_length_mismatches": sum(r.output_tokens != r.expected_output_tokens for r in done),
        "duration_s": duration,
        "request_throughput": len(done) / duration,
        "output_token_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "goodput": sum(is_good(r, slos) for r in done) / duration if slos else None,
        "slos_ms": slos or {},
        "bucket_thresholds": list(thresholds),
        **_latencies(done),
        "buckets": {},
    }
    summary.update(policy_figures(results, done, duration))
    for name in BUCKETS:
        members = [r for r in results if bucket_of(r.prompt_tokens, thresholds) == name]
        ok = [r for r in members if r.success]
        summary["buckets"][name] = {
            "requests": len(ok),
            "failed": len(members) - len(ok),
            "mean_prompt_tokens": float(np.mean([r.prompt_tokens for r in ok])) if ok else None,
            **_latencies(ok),
        }
    return summary
