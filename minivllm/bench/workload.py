"""Seeded request traces: the seed report's multi-user generator and a `vllm bench serve` random one.

Seed scenarios (report section 2.1, `scenario_configs`): each user sends a Poisson(lambda_requests)
number of requests, separated by Exponential(rate=lambda_frequency) gaps (cumulated per user, all
users starting at 0); each request picks a length class with probability `weights` and draws its
length from Poisson(length_lambda) of that class -- the class lambda is the class mean, and a
Poisson draw keeps a class tight around it, as the report's short bucket (mean 100.5-104 tokens
for a 100-token class) shows. `medium` has 12 users as in the report's code; its prose says 16.

A drawn length L is the request's *prompt* length, as in the report (it bucketed requests by the
token count of the code sample it sent). `--length-scale` multiplies L, so a CPU can run the
trace: "auto" is server context / 32768 (Qwen2.5-7B's context, the report's model), keeping the
30000-token class just inside the context as it was there. The output length is derived from L:
round(L * output_ratio), at least 2 (so TPOT is defined), at most the report's max_tokens 2048
times the scale. If prompt + output exceeds the server's context, the prompt is cut to fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SEED_CONTEXT = 32768  # max_position_embeddings of Qwen2.5-7B-Instruct, the seed report's model
SEED_MAX_TOKENS = 2048  # the report's max_tokens
SEED_BUCKETS = (500, 5000)  # short < 500 <= medium <= 5000 < long (prompt tokens)
PRIORITY_LEVELS = 3  # priorities 0 (served first, as in vLLM) .. 2


@dataclass(frozen=True)
class Scenario:
    user_count: int
    lambda_requests: float  # mean requests per user (Poisson)
    lambda_frequency: float  # requests per second per user (exponential gaps)
    weights: tuple[float, ...]  # probability of each length class
    length_lambdas: tuple[int, ...]  # mean prompt tokens of each length class


SCENARIOS = {
    "low": Scenario(8, 5, 0.05, (0.5, 0.3, 0.15, 0.05), (20, 100, 2000, 15000)),
    "medium": Scenario(12, 10, 0.2, (0.2, 0.3, 0.35, 0.15), (20, 100, 2000, 20000)),
    "high": Scenario(24, 20, 0.5, (0.1, 0.2, 0.35, 0.35), (100, 1500, 5000, 30000)),
}
WORKLOADS = ("seed-low", "seed-medium", "seed-high", "random")  # and FILE_KINDS' KIND:PATH


@dataclass(frozen=True)
class TraceEntry:
    send_time: float  # seconds after the start of the replay
    user: int
    prompt_tokens: int
    output_tokens: int
    priority: int | None = None
    hash_ids: tuple[int, ...] = ()  # real traces (Mooncake): ids of the prompt's prefix blocks
    prompt_text: str | None = None  # prompt files (custom:PATH): the prompt itself


@dataclass
class Trace:
    workload: str
    entries: list[TraceEntry]
    length_scale: float = 1.0
    buckets: tuple[float, float] = SEED_BUCKETS  # prompt-token thresholds, scaled
    num_capped: int = 0  # prompts cut to fit the context
    prefix_block_tokens: int = 0  # tokens per hash id (Mooncake: 512 x length scale)


def resolve_length_scale(value: str | float, max_model_len: int | None) -> float:
    if value != "auto":
        scale = float(value)
        if scale <= 0:
            raise ValueError(f"length scale must be > 0, got {value!r}")
        return scale
    return (max_model_len or 2048) / SEED_CONTEXT


def draw_priority(by: str, user: int, prompt_tokens: int, buckets: tuple[float, float]) -> int | None:
    """`user`: users take turns at the levels; `length`: short 0, medium 1, long 2."""
    if by == "none":
        return None
    if by == "user":
        return (user - 1) % PRIORITY_LEVELS
    if by == "length":
        return 0 if prompt_tokens < buckets[0] else 1 if prompt_tokens <= buckets[1] else 2
    raise ValueError(f"priority must be none, user or length, got {by!r}")


def fit_context(prompt: int, output: int, max_model_len: int | None) -> tuple[int, int, bool]:
    """Cut the prompt (then the output) so prompt + output <= max_model_len."""
    if max_model_len is None or prompt + output <= max_model_len:
        return prompt, output, False
    output = min(output, max_model_len // 2)
    return max(1, max_model_len - output), output, True


def seed_trace(scenario: str, seed: int = 0, length_scale: float = 1.0,
               max_model_len: int | None = None, output_ratio: float = 0.25,
               priority: str = "none", num_prompts: int | None = None) -> Trace:
    """The report's generator; `num_prompts` keeps only the first N requests by send time."""
    cfg = SCENARIOS[scenario]
    rng = np.random.default_rng(seed)
    buckets = (SEED_BUCKETS[0] * length_scale, SEED_BUCKETS[1] * length_scale)
    max_out = max(2, round(SEED_MAX_TOKENS * length_scale))
    events = []
    for user in range(1, cfg.user_count + 1):
        count = rng.poisson(cfg.lambda_requests)
        if count <= 0:
            continue
        classes = rng.choice(len(cfg.weights), size=count, p=cfg.weights)
        lengths = rng.poisson(np.asarray(cfg.length_lambdas)[classes])
        times = np.cumsum(rng.exponential(1.0 / cfg.lambda_frequency, size=count))
        events += [(float(t), user, int(n)) for t, n in zip(times, lengths, strict=True)]
    events = sorted(events)[:num_prompts]
    trace = Trace(f"seed-{scenario}", [], length_scale, buckets)
    for t, user, length in events:
        prompt = max(1, round(length * length_scale))
        output = min(max_out, max(2, round(prompt * output_ratio)))
        prompt, output, capped = fit_context(prompt, output, max_model_len)
        trace.num_capped += capped
        pri = draw_priority(priority, user, prompt, buckets)
        trace.entries.append(TraceEntry(t, user, prompt, output, pri))
    return trace


def arrival_times(n: int, request_rate: float, burstiness: float,
                  rng: np.random.Generator) -> np.ndarray:
    """n send times, the first at 0, gaps ~ Gamma(shape=burstiness, mean=1/request_rate):
    a Poisson process at burstiness 1; all at 0 for an infinite rate (vllm bench serve's)."""
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if np.isinf(request_rate):
        return np.zeros(n)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def random_trace(num_prompts: int, input_len: int, output_len: int, request_rate: float = float("inf"),
                 burstiness: float = 1.0, seed: int = 0, max_model_len: int | None = None,
                 priority: str = "none") -> Trace:
    """Fixed lengths; gaps ~ Gamma(shape=burstiness, mean=1/request_rate), first request at 0.

    burstiness 1 is a Poisson process; < 1 burstier, > 1 more regular (as in `vllm bench serve`).
    Each request is its own user.
    """
    times = arrival_times(num_prompts, request_rate, burstiness, np.random.default_rng(seed))
    prompt, output, capped = fit_context(input_len, output_len, max_model_len)
    trace = Trace("random", [], 1.0, SEED_BUCKETS, num_capped=capped * num_prompts)
    for i, t in enumerate(times[:num_prompts]):
        pri = draw_priority(priority, i + 1, prompt, SEED_BUCKETS)
        trace.entries.append(TraceEntry(float(t), i + 1, prompt, output, pri))
    return trace
