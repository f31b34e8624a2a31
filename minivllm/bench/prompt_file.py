"""A file of real prompts as a workload: `--workload custom:PATH` (vLLM's `vllm bench serve
--dataset-name custom --dataset-path PATH`, which `bench` also accepts).

The file is vLLM's custom dataset: JSONL, one object a line with a non-empty string "prompt"
(other fields are ignored). The prompts are sent as they are -- as the user message of a chat
request (the server applies the model's template; the default endpoint for this workload) or
as completions text -- and the model decides how long each answer is: requests carry
`max_tokens` = `--custom-output-len` (default 256, vLLM's) as a cap, without ignore_eos, so
each ends at the model's EOS. Which prompts, in which order: the rows from `--start`,
shuffled with `--seed` (vLLM shuffles too; `--disable-shuffle` keeps the file's order),
`--num-prompts` of them (default: every row once; more than the rows repeats them, a new
shuffle per pass). Arrivals: Poisson at `--request-rate` (gamma gaps with `--burstiness`, as
the random workload; all at once by default), seeded. Every request is its own user.

Prompt lengths are counted with the server's tokenizer (the message, not the template), so
building the trace needs them from the caller (bench/replay.py counts them). The report's
buckets are the prompt-length terciles of the trace: short < first <= medium <= second < long.
A malformed line raises ValueError naming the file, the line and what was wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from minivllm.bench.jsonl import line_error, read_objects
from minivllm.bench.workload import Trace, TraceEntry, arrival_times, draw_priority, fit_context

CUSTOM_OUTPUT_LEN = 256  # vllm bench serve's --custom-output-len default


def read_custom(path: str | Path) -> list[str]:
    """The prompts of a custom dataset file, in the file's order (blank lines skipped)."""
    path = Path(path)
    prompts = []
    for line, obj in read_objects(path):
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise line_error(path, line, f"\"prompt\" must be a non-empty string, got "
                                         f"{prompt!r}")
        prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def custom_trace(path: str | Path, prompt_tokens: Sequence[int] | None, *, seed: int = 0,
                 num_prompts: int | None = None, start: int = 0,
                 request_rate: float = float("inf"), burstiness: float = 1.0,
                 output_len: int = CUSTOM_OUTPUT_LEN, max_model_len: int | None = None,
                 priority: str = "none", shuffle: bool = True) -> Trace:
    """`prompt_tokens[i]`: the token count of the file's i-th prompt (the server's tokenizer)."""
    path = Path(path)
    texts = read_custom(path)
    if prompt_tokens is None:
        raise ValueError(f"custom:{path}: prompt lengths need the server's tokenizer "
                         "(bench serve / bench policies)")
    if len(prompt_tokens) != len(texts):
        raise ValueError(f"custom:{path}: {len(prompt_tokens)} token counts for "
                         f"{len(texts)} prompts")
    if start < 0 or start >= len(texts):
        raise ValueError(f"{path}: start must be in 0..{len(texts) - 1}, got {start}")
    if output_len < 1:
        raise ValueError(f"custom output length must be >= 1, got {output_len}")
    rng = np.random.default_rng(seed)
    rows = np.arange(start, len(texts))
    n = num_prompts or len(rows)
    order: list[int] = []
    while len(order) < n:
        order += (rng.permutation(rows) if shuffle else rows).tolist()
    order = order[:n]
    times = arrival_times(n, request_rate, burstiness, rng)
    lengths = [prompt_tokens[i] for i in order]
    low, high = np.quantile(lengths, [1 / 3, 2 / 3])
    trace = Trace(f"custom:{path.name}", [], 1.0, (float(low), float(high)))
    for k, (i, t) in enumerate(zip(order, times, strict=True)):
        prompt, output, capped = fit_context(prompt_tokens[i], output_len, max_model_len)
        if capped:  # a real prompt is not cut: its answer's cap is
            prompt, output = prompt_tokens[i], max(1, max_model_len - prompt_tokens[i])
        trace.num_capped += capped
        pri = draw_priority(priority, k + 1, prompt, trace.buckets)
        trace.entries.append(TraceEntry(float(t), k + 1, prompt, output, pri,
                                        prompt_text=texts[i]))
    return trace
