"""Request models of vLLM's POST /tokenize and /detokenize."""

from __future__ import annotations

from minivllm.entrypoints.openai.protocol import ChatMessage, OpenAIModel


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
