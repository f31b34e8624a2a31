"""Production traces as workloads: `--workload azure:PATH` and `--workload mooncake:PATH`;
build_trace, the one entry point for every --workload (built-in ones: workload.py).

- Azure LLM inference trace (CSV, header `TIMESTAMP,ContextTokens,GeneratedTokens`; the 2023
  code and conversation services and the 2024 week-long traces share it). TIMESTAMP is a wall
  clock (`2023-11-16 18:17:03.9799600`, any number of fractional digits) or plain seconds;
  arrivals count from the first row of the window.
- Mooncake (JSONL, one object a line: `timestamp` in ms, `input_length`, `output_length`,
  `hash_ids`: one id per 512-token block of the prompt, equal ids = the same tokens). Each
  request remembers its ids, and prompt builders turn each id into one fixed block of tokens,
  so a prefix cache sees exactly the reuse the trace describes.

The window is `--start` (first row, 0-based) and `--num-prompts` (rows kept). `--time-scale`
multiplies the gaps between arrivals (0.5 replays twice as fast); `--length-scale` multiplies
prompt and output lengths and the 512-token block of a hash id alike. Output lengths are the
trace's (sent with ignore_eos and max_tokens), at least 2 so TPOT exists. A prompt + output
beyond the context is cut to fit, as for the seed workloads. Every trace entry is its own user.
A malformed row raises ValueError naming the file, the line and what was wrong.

`--workload custom:PATH`, a file of real prompts, is bench/prompt_file.py's.
"""

from __future__ import annotations

import csv
import math
from datetime import datetime
from pathlib import Path

from minivllm.bench.jsonl import line_error, read_objects
from minivllm.bench.prompt_file import CUSTOM_OUTPUT_LEN, custom_trace
from minivllm.bench.workload import (
    SEED_BUCKETS,
    WORKLOADS,
    Trace,
    TraceEntry,
    draw_priority,
    fit_context,
    random_trace,
    resolve_length_scale,
    seed_trace,
)

TRACE_KINDS = ("azure", "mooncake")
FILE_KINDS = (*TRACE_KINDS, "custom")  # --workload KIND:PATH
MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id in Mooncake's traces
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _count(path: Path, line: int, name: str, value, minimum: int) -> int:
    """A token count field: an integer >= minimum (JSON ints, or CSV text of one)."""
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        number = int(value)
    except (TypeError, ValueError):
        raise line_error(path, line, f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise line_error(path, line, f"{name} must be >= {minimum}, got {number}")
    return number


def _azure_time(path: Path, line: int, text: str) -> float:
    """Seconds: plain seconds, or a wall clock whose fraction may have any number of digits."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    whole, _, fraction = text.partition(".")
    try:
        stamp = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp()
        return stamp + (float("0." + fraction) if fraction else 0.0)
    except ValueError:
        raise line_error(path, line, f"TIMESTAMP must be 'YYYY-MM-DD HH:MM:SS[.fraction]' or "
                               f"seconds, got {text!r}") from None


def read_azure(path: str | Path) -> list[tuple[float, int, int, tuple[int, ...]]]:
    """Rows as (arrival seconds, prompt tokens, output tokens, no hash ids)."""
    path = Path(path)
    rows = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != AZURE_COLUMNS:
            raise line_error(path, 1, f"expected the header {','.join(AZURE_COLUMNS)}, got {header!r}")
        for fields in reader:
            line = reader.line_num
            if not fields or fields == [""]:
                continue
            if len(fields) != 3:
                raise line_error(path, line, f"expected 3 fields, got {len(fields)}: {fields!r}")
            rows.append((_azure_time(path, line, fields[0]),
                         _count(path, line, "ContextTokens", fields[1].strip(), 1),
                         _count(path, line, "GeneratedTokens", fields[2].strip(), 1), ()))
    return rows


def read_mooncake(path: str | Path) -> list[tuple[float, int, int, tuple[int, ...]]]:
    """Rows as (arrival seconds, prompt tokens, output tokens, hash ids)."""
    path = Path(path)
    rows = []
    for line, obj in read_objects(path):
        missing = [k for k in ("timestamp", "input_length", "output_length") if k not in obj]
        if missing:
            raise line_error(path, line, f"missing field(s) {', '.join(missing)}")
        stamp = obj["timestamp"]
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or stamp < 0:
            raise line_error(path, line, f"timestamp must be milliseconds >= 0, got {stamp!r}")
        prompt = _count(path, line, "input_length", obj["input_length"], 1)
        hash_ids = obj.get("hash_ids", [])
        if (not isinstance(hash_ids, list)
                or any(isinstance(h, bool) or not isinstance(h, int) for h in hash_ids)):
            raise line_error(path, line, f"hash_ids must be a list of integers, got {hash_ids!r}")
        rows.append((stamp / 1000.0, prompt,
                     _count(path, line, "output_length", obj["output_length"], 1),
                     tuple(hash_ids)))
    return rows


def parse_workload(workload: str) -> tuple[str, Path] | None:
    """'azure:PATH' -> ('azure', PATH); None for the built-in workloads."""
    kind, sep, path = workload.partition(":")
    if not sep or kind not in FILE_KINDS:
        return None
    if not path:
        raise ValueError(f"--workload {kind}: needs a file, e.g. {kind}:path/to/trace")
    if not Path(path).is_file():
        raise ValueError(f"--workload {workload}: no such file {path!r}")
    return kind, Path(path)


def resolve_trace_scale(value: str | float, max_model_len: int | None) -> float:
    """'auto' keeps real traces at full length unless the context is below Qwen2.5-7B's
    32768, where it shrinks them as the seed workloads are shrunk (context / 32768)."""
    if value != "auto":
        scale = float(value)
        if not scale > 0:
            raise ValueError(f"length scale must be > 0, got {value!r}")
        return scale
    return min(1.0, (max_model_len or 32768) / 32768)


def trace_from_file(workload: str, *, start: int = 0, num_prompts: int | None = None,
                    time_scale: float = 1.0, length_scale: str | float = "auto",
                    max_model_len: int | None = None, priority: str = "none") -> Trace:
    parsed = parse_workload(workload)
    if parsed is None or parsed[0] not in TRACE_KINDS:
        raise ValueError(f"not a trace workload: {workload!r} (azure:PATH or mooncake:PATH)")
    kind, path = parsed
    if not time_scale > 0:
        raise ValueError(f"time scale must be > 0, got {time_scale!r}")
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    rows = read_azure(path) if kind == "azure" else read_mooncake(path)
    window = rows[start:start + num_prompts if num_prompts is not None else None]
    if not window:
        raise ValueError(f"{path}: no rows in the window start={start}, "
                         f"num_prompts={num_prompts} ({len(rows)} rows)")
    scale = resolve_trace_scale(length_scale, max_model_len)
    buckets = (SEED_BUCKETS[0] * scale, SEED_BUCKETS[1] * scale)
    block = max(1, round(MOONCAKE_BLOCK_TOKENS * scale))
    trace = Trace(f"{kind}:{path.name}", [], scale, buckets,
                  prefix_block_tokens=block if kind == "mooncake" else 0)
    t0 = min(t for t, *_ in window)
    for i, (t, prompt, output, hash_ids) in enumerate(window):
        prompt = max(1, round(prompt * scale))
        output = max(2, round(output * scale))
        prompt, output, capped = fit_context(prompt, output, max_model_len)
        trace.num_capped += capped
        pri = draw_priority(priority, i + 1, prompt, buckets)
        ids = hash_ids[:math.ceil(prompt / block)]
        trace.entries.append(TraceEntry((t - t0) * time_scale, i + 1, prompt, output, pri, ids))
    trace.entries.sort(key=lambda e: e.send_time)  # stable: equal stamps keep the file's order
    return trace


def symbolic_prompt(entry: TraceEntry, index: int, block_tokens: int) -> list[int]:
    """Token ids for a simulator, which needs no vocabulary: hash id h is the block
    h*B .. h*B+B-1 (so equal ids are equal blocks), everything else is unique to the request
    (negative ids, which no block uses)."""
    ids: list[int] = []
    for h in entry.hash_ids:
        ids.extend(range(h * block_tokens, h * block_tokens + block_tokens))
    del ids[entry.prompt_tokens:]
    tail = entry.prompt_tokens - len(ids)
    base = -(index + 1) * (1 << 24)  # a range of its own, wider than any context
    ids.extend(range(base, base + tail))
    return ids


def build_trace(spec: str, *, seed: int = 0, num_prompts: int | None = None,
                length_scale: str | float = "auto", max_model_len: int | None = None,
                output_ratio: float = 0.25, input_len: int = 256, output_len: int = 64,
                request_rate: float = float("inf"), burstiness: float = 1.0,
                priority: str = "none", start: int = 0, time_scale: float = 1.0,
                custom_output_len: int = CUSTOM_OUTPUT_LEN, shuffle: bool = True,
                prompt_tokens: list[int] | None = None) -> Trace:
    """One entry point for the CLI; `start` and `time_scale` apply to real traces;
    `custom_output_len`, `shuffle` and `prompt_tokens` (each row's token count) to custom:PATH."""
    if spec.startswith("custom:"):
        _, path = parse_workload(spec)
        return custom_trace(path, prompt_tokens, seed=seed, num_prompts=num_prompts,
                            start=start, request_rate=request_rate, burstiness=burstiness,
                            output_len=custom_output_len, max_model_len=max_model_len,
                            priority=priority, shuffle=shuffle)
    if spec.partition(":")[0] in ("azure", "mooncake"):
        return trace_from_file(spec, start=start, num_prompts=num_prompts,
                               time_scale=time_scale, length_scale=length_scale,
                               max_model_len=max_model_len, priority=priority)
    if spec == "random":
        return random_trace(num_prompts or 100, input_len, output_len, request_rate, burstiness,
                            seed, max_model_len, priority)
    if spec not in WORKLOADS:
        raise ValueError(f"unknown workload {spec!r}; choose from {', '.join(WORKLOADS)}, "
                         "azure:PATH, mooncake:PATH, custom:PATH")
    scale = resolve_length_scale(length_scale, max_model_len)
    return seed_trace(spec.removeprefix("seed-"), seed, scale, max_model_len, output_ratio,
                      priority, num_prompts)
