"""Request and response models of the OpenAI-compatible API (OpenAI's and vLLM's field names).

Requests accept and ignore fields they do not know (`logit_bias`, ...), as OpenAI clients
send many; `user` is read (the tenant of the vtc policy, and the dashboard's). Structured
outputs' and tools' models are in protocol_tools.py. Ranges are checked by SamplingParams,
which names the field; NaN and infinities (which Python's JSON parser accepts) are refused
here, as are seeds outside int64.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from minivllm.entrypoints.openai.protocol_tools import (
    ChatCompletionToolsParam,
    DeltaToolCall,
    NamedToolChoice,
    ResponseFormat,
    StructuredOutputsRequest,
    ToolCall,
)


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(OpenAIModel):
    include_usage: bool = False


class SamplingRequest(OpenAIModel):
    """Fields that completions and chat completions share."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    priority: int = 0
    cache_salt: str | None = None  # requests with different salts never share prefix cache
    # For the scheduling policies: OpenAI's `user` is the tenant vtc shares service across;
    # ttft_slo_ms / e2e_slo_ms are edf's deadlines, ms after arrival (unset: the server's).
    user: str | None = Field(None, max_length=256)
    ttft_slo_ms: float | None = Field(None, gt=0)
    e2e_slo_ms: float | None = Field(None, gt=0)
    # Structured outputs (at most one): OpenAI's response_format, vLLM's structured_outputs
    # and its older guided_* fields
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: str | dict | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's: the prompt's and the output's token ids in the answer (a stream's first chunk
    # carries the prompt's, each chunk its new tokens'); the prompt's logprobs (not streamed)
    return_token_ids: bool | None = None
    prompt_logprobs: int | None = None
    # Lab only (bench replaying a trace): the true output length, for a server run with
    # --length-predictor oracle; any other server refuses it (400).
    oracle_output_len: int | None = Field(None, ge=1)


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # an explicit null means "the rest of the context"
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    # vLLM's beam search: n beams, their hypotheses scored sum_logprobs / len ** length_penalty
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False


class TextPart(OpenAIModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls, sent back
    tool_call_id: str | None = None  # a tool message: the call it answers

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True


class TokenizeRequest(OpenAIModel):
    """vLLM's /tokenize: either a prompt or chat messages."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[int]


# ---- responses ---------------------------------------------------------------------------


class PromptTokenUsageInfo(OpenAIModel):
    cached_tokens: int = 0  # prompt tokens the prefix cache served


class UsageInfo(OpenAIModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None

    @classmethod
    def count(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageInfo:
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens,
                   prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=cached_tokens))


class CompletionLogProbs(OpenAIModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(OpenAIModel):
    """vLLM's Logprob as its prompt_logprobs field writes it."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One per prompt token, None for the first (nothing before it predicts it). Left out of the
# JSON when not asked for, as are the token id fields below.
PromptLogprobs = list[dict[int, PromptLogprob] | None]


def _unless_asked(default=None):
    return Field(default, exclude_if=lambda value: value is None)


class CompletionChoice(OpenAIModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = _unless_asked()
    prompt_logprobs: PromptLogprobs | None = _unless_asked()
    prompt_token_ids: list[int] | None = _unless_asked()


class CompletionResponse(OpenAIModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(OpenAIModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobToken(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(OpenAIModel):
    content: list[ChatLogprobToken] | None = None


class ChatResponseMessage(OpenAIModel):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None  # --reasoning-parser: the <think> part
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(OpenAIModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = _unless_asked()


class ChatCompletionResponse(OpenAIModel):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = _unless_asked()
    prompt_token_ids: list[int] | None = _unless_asked()


class DeltaMessage(OpenAIModel):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(OpenAIModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = _unless_asked()


class ChatCompletionChunk(OpenAIModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = _unless_asked()


class ErrorInfo(OpenAIModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIModel):
    error: ErrorInfo
