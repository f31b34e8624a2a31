"""Request models of POST /tokenize and /detokenize: vLLM's fields, and llama-server's
(`content`, `add_special`, `parse_special`, `with_pieces`; llamacpp/tokenize.py)."""

from __future__ import annotations

from minivllm.entrypoints.openai.protocol import ChatMessage, OpenAIModel


class TokenizeRequest(OpenAIModel):
    """vLLM's /tokenize: either a prompt or chat messages; or llama-server's: content."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    # llama-server's form
    content: str | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[int]
