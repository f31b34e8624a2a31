"""Request and response models of POST /v1/embeddings (OpenAI's field names)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from minivllm.entrypoints.openai.protocol import OpenAIModel


class EmbeddingRequest(OpenAIModel):
    # One text, texts, one token-id list or token-id lists: one embedding each.
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None  # keep the first this many values, then normalize
    user: str | None = None  # the tenant (vtc), as on the other endpoints


class EmbeddingData(OpenAIModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # base64: the little-endian float32 bytes


class EmbeddingUsage(OpenAIModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(OpenAIModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData] = Field(default_factory=list)
    model: str
    usage: EmbeddingUsage
