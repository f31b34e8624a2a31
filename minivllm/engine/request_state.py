"""What the OutputProcessor keeps per request: its output tokens, sampling parameters,
detokenizer, logprobs, timestamps — and how to turn them into RequestOutputs: cumulative,
final only, or (what streams consume) only what is new since the last one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from minivllm.engine.detokenizer import IncrementalDetokenizer, TokenTexts
from minivllm.engine.parallel_sampling import best_of
from minivllm.outputs import (
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    Logprob,
    RequestMetrics,
    RequestOutput,
)
from minivllm.sampling_params import RequestOutputKind, SamplingParams


@dataclass
class RequestState:
    """One sequence: for n > 1 a request has several, which share its prompt."""

    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    group_id: str
    index: int
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # What DELTA outputs have carried so far.
    sent_tokens: int = 0
    sent_text: int = 0
    sent_finish: bool = False

    def _sendable_text_end(self) -> int:
        """Until the sequence finishes, the last len(stop) - 1 characters stay back: a stop
        string that the next tokens complete could still cut them off."""
        text, stop = self.detokenizer.text, self.params.stop
        if self.finish_reason is not None or not stop:
            return len(text)
        return max(self.sent_text, len(text) - (max(len(s) for s in stop) - 1))

    def delta(self, token_texts: TokenTexts, index: int, with_logprobs: bool
              ) -> CompletionOutput | None:
        """What is new since the last delta, or None when nothing is."""
        if self.sent_finish:
            return None
        output_ids = self.output_token_ids
        text_end = self._sendable_text_end()
        token_ids = output_ids[self.sent_tokens:]
        logprobs = None
        if with_logprobs and self.logprobs is not None:
            logprobs = self.logprobs[self.sent_tokens:]
            _decode_logprobs(token_texts, logprobs)
        text = self.detokenizer.text[self.sent_text:text_end]
        if not (token_ids or text or self.finish_reason):
            return None
        self.sent_tokens, self.sent_text = len(output_ids), text_end
        self.sent_finish = self.finish_reason is not None
        return self._completion(index, text, token_ids, logprobs)

    def cumulative(self, token_texts: TokenTexts, index: int, with_logprobs: bool
                   ) -> CompletionOutput:
        logprobs = self.logprobs if with_logprobs else None
        if logprobs is not None:
            _decode_logprobs(token_texts, logprobs)
        return self._completion(index, self.detokenizer.text,
                                list(self.output_token_ids), logprobs)

    def _completion(self, index: int, text: str, token_ids: list[int],
                    logprobs: list[dict[int, Logprob]] | None) -> CompletionOutput:
        return CompletionOutput(
            index=index, text=text, token_ids=token_ids,
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            logprobs=logprobs, finish_reason=self.finish_reason, stop_reason=self.stop_reason)


@dataclass
class RequestGroup:
    """What the caller submitted: one prompt, n (or best_of) sequences, its outputs."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    n: int
    with_logprobs: bool  # the caller asked for logprobs (best_of needs them internally)
    metrics: RequestMetrics
    output_kind: RequestOutputKind
    sequences: list[RequestState] = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    error: str | None = None
    num_cached_tokens: int = 0
    sent_prompt_logprobs: bool = False
    pooled: list[float] | None = None  # a pooling request's vector, when it has finished

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.sequences)

    def add_prompt_logprobs(self, first: int, scored: list[dict[int, Logprob]]) -> None:
        """Keep the prompt logprobs of positions not seen yet (a recompute repeats them)."""
        assert self.prompt_logprobs is not None
        for index, entry in enumerate(scored, start=first):
            if index == len(self.prompt_logprobs):
                self.prompt_logprobs.append(entry)

    def to_output(self, token_texts: TokenTexts
                  ) -> RequestOutput | EmbeddingRequestOutput | None:
        """This step's output in the request's kind, or None when it has nothing to say."""
        if self.pooled is not None:
            return EmbeddingRequestOutput(
                request_id=self.request_id, outputs=EmbeddingOutput(self.pooled),
                prompt_token_ids=self.prompt_token_ids,
                metrics=dataclasses.replace(self.metrics),
                num_cached_tokens=self.num_cached_tokens)
        finished = self.finished
        kind = self.output_kind
        if kind is RequestOutputKind.FINAL_ONLY and not finished:
            return None
        sequences = self.sequences
        if len(sequences) > self.n:  # best_of: the n most likely, known only at the end
            if not finished:
                return None
            sequences = best_of(sequences, self.n)
            kind = RequestOutputKind.CUMULATIVE
        if kind is RequestOutputKind.DELTA:
            outputs = [c for i, s in enumerate(sequences)
                       if (c := s.delta(token_texts, i, self.with_logprobs)) is not None]
            if not outputs and not finished and self.error is None:
                return None
        else:
            outputs = [s.cumulative(token_texts, i, self.with_logprobs)
                       for i, s in enumerate(sequences)]
        prompt_logprobs = None
        if self.prompt_logprobs is not None and not (
                kind is RequestOutputKind.DELTA and self.sent_prompt_logprobs):
            _decode_logprobs(token_texts, [p for p in self.prompt_logprobs if p])
            prompt_logprobs, self.sent_prompt_logprobs = self.prompt_logprobs, True
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=prompt_logprobs,
            outputs=outputs,
            finished=finished,
            metrics=dataclasses.replace(self.metrics),  # a snapshot: the engine updates its own
            num_cached_tokens=self.num_cached_tokens,
            error=self.error,
        )


def _decode_logprobs(token_texts: TokenTexts, entries: list[dict[int, Logprob]]) -> None:
    for entry in entries:
        for token_id, logprob in entry.items():
            if logprob.decoded_token is None:
                logprob.decoded_token = token_texts(token_id)
