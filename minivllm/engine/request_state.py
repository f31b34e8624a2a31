"""What the engine keeps per request beside the scheduler's Request: sampling parameters,
detokenizer, logprobs, timestamps — and how to turn them into a RequestOutput."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minivllm.core.request import Request
from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from minivllm.sampling_params import SamplingParams


@dataclass
class RequestState:
    request: Request
    params: SamplingParams
    prompt: str | None
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None
    metrics: RequestMetrics
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float = 0.0
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    token_times: list[float] = field(default_factory=list)

    def add_prompt_logprobs(self, first: int, scored: list[dict[int, Logprob]]) -> None:
        """Keep the prompt logprobs of positions not seen yet (a recompute repeats them)."""
        assert self.prompt_logprobs is not None
        for index, entry in enumerate(scored, start=first):
            if index == len(self.prompt_logprobs):
                self.prompt_logprobs.append(entry)

    def to_output(self, tokenizer) -> RequestOutput:
        request = self.request
        completion = CompletionOutput(
            index=0,
            text=self.detokenizer.text,
            token_ids=list(request.output_token_ids),
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )
        if self.logprobs is not None:
            _decode_logprobs(tokenizer, self.logprobs)
        if self.prompt_logprobs is not None:
            _decode_logprobs(tokenizer, [p for p in self.prompt_logprobs if p])
        return RequestOutput(
            request_id=request.request_id,
            prompt=self.prompt,
            prompt_token_ids=request.prompt_token_ids,
            prompt_logprobs=self.prompt_logprobs,
            outputs=[completion],
            finished=self.finish_reason is not None,
            metrics=self.metrics,
            num_cached_tokens=request.num_cached_tokens,
            error=self.error,
        )


def _decode_logprobs(tokenizer, entries: list[dict[int, Logprob]]) -> None:
    for entry in entries:
        for token_id, logprob in entry.items():
            if logprob.decoded_token is None:
                logprob.decoded_token = tokenizer.decode([token_id])
