"""Request and response models of POST /v1/completions (OpenAI's and vLLM's field names;
the fields it shares with chat are SamplingRequest's, in ../protocol.py)."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from minivllm.entrypoints.openai.protocol import (
    OpenAIModel,
    PromptLogprobs,
    SamplingRequest,
    UsageInfo,
    unless_asked,
)


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # an explicit null means "the rest of the context"
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    # The code after the insertion point: the prompt is the code before it, and the model
    # writes the middle from its fill-in-the-middle tokens (llamacpp/fim.py)
    suffix: str | None = None
    # vLLM's beam search: n beams, their hypotheses scored sum_logprobs / len ** length_penalty
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False


class CompletionLogProbs(OpenAIModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(OpenAIModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = unless_asked()
    prompt_logprobs: PromptLogprobs | None = unless_asked()
    prompt_token_ids: list[int] | None = unless_asked()


class CompletionResponse(OpenAIModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
