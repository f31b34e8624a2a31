"""POST /api/embed (and the older /api/embeddings): the inputs, truncated to the context
when `truncate` (Ollama's default), embedded by the OpenAI embeddings serving object."""

from __future__ import annotations

import json
import time

from fastapi.responses import JSONResponse

from minivllm.entrypoints.ollama.protocol import EmbeddingsRequest, EmbedRequest
from minivllm.entrypoints.openai.embedding.protocol import EmbeddingRequest
from minivllm.entrypoints.openai.errors import OpenAIError

NS = 1_000_000_000


class OllamaServingEmbed:
    def __init__(self, embeddings) -> None:
        self.embeddings = embeddings

    async def _embed(self, texts: list[str], served: str, truncate: bool,
                     dimensions: int | None) -> tuple[list[list[float]], int]:
        """(the embeddings, the prompt tokens counted)"""
        if not texts:
            raise OpenAIError("input must not be empty", 400, "input")
        serving = self.embeddings
        serving.check_limit("input", len(texts), "max_prompts_per_request")
        inputs = []
        for text in texts:
            if not text:
                raise OpenAIError("input must not contain an empty string", 400, "input")
            token_ids = serving.encode(text, "input")
            # Ollama's truncate: cut the end off what the context cannot hold
            inputs.append(token_ids[:serving.max_model_len] if truncate else token_ids)
        response = await serving.create(EmbeddingRequest(input=inputs, model=served,
                                                         dimensions=dimensions))
        body = json.loads(response.body)
        return [d["embedding"] for d in body["data"]], body["usage"]["prompt_tokens"]

    async def embed(self, req: EmbedRequest, served: str, received: float) -> JSONResponse:
        texts = [req.input] if isinstance(req.input, str) else req.input
        vectors, count = await self._embed(texts, served, req.truncate, req.dimensions)
        return JSONResponse({"model": req.model, "embeddings": vectors,
                             "total_duration": int((time.time() - received) * NS),
                             "load_duration": 0, "prompt_eval_count": count})

    async def embeddings_(self, req: EmbeddingsRequest, served: str) -> JSONResponse:
        vectors, _ = await self._embed([req.prompt], served, True, None)
        return JSONResponse({"embedding": vectors[0]})
