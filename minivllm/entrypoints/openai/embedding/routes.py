"""The route of the embeddings API: POST /v1/embeddings."""

from __future__ import annotations

from fastapi import FastAPI, Request, Response

from minivllm.entrypoints.openai.embedding.protocol import EmbeddingRequest
from minivllm.entrypoints.openai.embedding.serving import OpenAIServingEmbedding
from minivllm.entrypoints.openai.streaming import cancel_on_disconnect


def add_embedding_routes(app: FastAPI, embeddings: OpenAIServingEmbedding) -> None:
    @app.post("/v1/embeddings")
    async def create_embedding(req: EmbeddingRequest, raw: Request) -> Response:
        return await cancel_on_disconnect(raw, embeddings.create(req))
