"""What the engine keeps per request beside the scheduler's Request: sampling parameters,
detokenizer, logprobs, timestamps — and how to turn them into a RequestOutput."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minivllm.core.request import Request
from minivllm.engine.detokenizer import IncrementalDetokenizer, TokenTexts
from minivllm.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from minivllm.sampling_params import SamplingParams


@dataclass
class RequestState:
    """One sequence: for n > 1 a request has several, which share its prompt."""

    request: Request
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None
    group_id: str
    index: int
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def to_completion(self, token_texts: TokenTexts, index: int, with_logprobs: bool
                      ) -> CompletionOutput:
        if with_logprobs and self.logprobs is not None:
            _decode_logprobs(token_texts, self.logprobs)
        return CompletionOutput(
            index=index,
            text=self.detokenizer.text,
            token_ids=list(self.request.output_token_ids),
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            logprobs=self.logprobs if with_logprobs else None,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )


@dataclass
class RequestGroup:
    """What the caller submitted: one prompt, n (or best_of) sequences, one RequestOutput."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    n: int
    with_logprobs: bool  # the caller asked for logprobs (best_of needs them internally)
    metrics: RequestMetrics
    sequences: list[RequestState] = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    error: str | None = None
    token_times: list[float] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.sequences)

    def add_prompt_logprobs(self, first: int, scored: list[dict[int, Logprob]]) -> None:
        """Keep the prompt logprobs of positions not seen yet (a recompute repeats them)."""
        assert self.prompt_logprobs is not None
        for index, entry in enumerate(scored, start=first):
            if index == len(self.prompt_logprobs):
                self.prompt_logprobs.append(entry)

    def to_output(self, token_texts: TokenTexts) -> RequestOutput:
        sequences = self.sequences
        if self.finished and len(sequences) > self.n:  # best_of: the n most likely
            sequences = sorted(sequences, key=lambda s: -s.cumulative_logprob)[:self.n]
        if self.prompt_logprobs is not None:
            _decode_logprobs(token_texts, [p for p in self.prompt_logprobs if p])
        head = sequences[0].request
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=self.prompt_logprobs,
            outputs=[s.to_completion(token_texts, i, self.with_logprobs)
                     for i, s in enumerate(sequences)],
            finished=self.finished,
            metrics=self.metrics,
            num_cached_tokens=head.num_cached_tokens,
            error=self.error,
        )


def _decode_logprobs(token_texts: TokenTexts, entries: list[dict[int, Logprob]]) -> None:
    for entry in entries:
        for token_id, logprob in entry.items():
            if logprob.decoded_token is None:
                logprob.decoded_token = token_texts(token_id)
