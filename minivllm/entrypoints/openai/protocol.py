"""The models every endpoint of the OpenAI-compatible API shares (OpenAI's and vLLM's field
names): the sampling fields of completions and chat, chat messages, usage, prompt logprobs,
errors. Each endpoint's own models are in its folder's protocol.py.

Requests accept and ignore fields they do not know (`logit_bias`, ...), as OpenAI clients
send many; `user` is read (the tenant of the vtc policy, and the dashboard's). Structured
outputs' and tools' models are in protocol_tools.py. Ranges are checked by SamplingParams,
which names the field; NaN and infinities (which Python's JSON parser accepts) are refused
here, as are seeds outside int64.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from minivllm.entrypoints.openai.protocol_tools import (
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


class PromptLogprob(OpenAIModel):
    """vLLM's Logprob as its prompt_logprobs field writes it."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One per prompt token, None for the first (nothing before it predicts it). Left out of the
# JSON when not asked for, as are the endpoints' token id fields (unless_asked).
PromptLogprobs = list[dict[int, PromptLogprob] | None]


def unless_asked(default=None):
    return Field(default, exclude_if=lambda value: value is None)


class ErrorInfo(OpenAIModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIModel):
    error: ErrorInfo
