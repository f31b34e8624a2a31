"""What the engine hands back: RequestOutput / CompletionOutput, and a pooling request's
EmbeddingRequestOutput / EmbeddingOutput, spelled like vLLM's."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per position: token id -> Logprob (the chosen token is always present).
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class RequestMetrics:
    """Wall-clock timestamps (time.time()) of a request's life, vLLM's field names."""

    arrival_time: float
    last_token_time: float | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    time_in_queue: float | None = None
    finished_time: float | None = None
    # minivllm's: the engine steps until the first token, and all the tokens they computed
    # (this request's prompt and the other requests' tokens that shared those steps)
    prefill_steps: int = 0
    prefill_step_tokens: int = 0


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    error: str | None = field(default=None)  # set when the request failed inside the engine

    def add(self, later: RequestOutput) -> None:
        """Fold a later DELTA output of the same request into this one (a reader that fell
        behind reads both as one)."""
        by_index = {c.index: c for c in self.outputs}
        for c in later.outputs:
            mine = by_index.get(c.index)
            if mine is None:
                self.outputs.append(c)
                continue
            mine.text += c.text
            mine.token_ids += c.token_ids
            if c.logprobs is not None:
                mine.logprobs = (mine.logprobs or []) + c.logprobs
            mine.cumulative_logprob = c.cumulative_logprob
            mine.finish_reason, mine.stop_reason = c.finish_reason, c.stop_reason
        self.outputs.sort(key=lambda c: c.index)
        if self.prompt_logprobs is None:
            self.prompt_logprobs = later.prompt_logprobs
        self.finished, self.metrics, self.error = later.finished, later.metrics, later.error
        self.num_cached_tokens = later.num_cached_tokens


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    """A pooling request's one output (vLLM's): its prompt pooled into a vector."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    error: str | None = None
