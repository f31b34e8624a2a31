"""POST /v1/embeddings: one pooling request per input, through the same engine, scheduler
and steps as generation (a pooling request is prefilled and pooled, never decoded)."""

from __future__ import annotations

import base64
import struct
import uuid

from fastapi.responses import JSONResponse

from minivllm.engine.errors import RunnerMismatchError
from minivllm.engine.messages import make_pooling_request
from minivllm.entrypoints.openai.embedding.protocol import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
)
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.serving import OpenAIServing
from minivllm.entrypoints.openai.streaming import gather_or_cancel, last_output
from minivllm.pooling_params import PoolingParams


class OpenAIServingEmbedding(OpenAIServing):
    async def create(self, req: EmbeddingRequest) -> JSONResponse:
        lora = self.check_model(req.model)
        if req.dimensions is not None and req.dimensions < 1:
            raise OpenAIError(f"dimensions must be >= 1, got {req.dimensions}", 400,
                              "dimensions")
        inputs = self._tokenize_inputs(req.input)
        request_id = f"embd-{uuid.uuid4().hex}"
        gens = [self.engine.encode(make_pooling_request(
                    f"{request_id}-{i}", token_ids, PoolingParams(dimensions=req.dimensions),
                    user=req.user, lora_request=lora), prompt_text=text)
                for i, (text, token_ids) in enumerate(inputs)]
        try:
            finals = await gather_or_cancel(last_output(gen) for gen in gens)
        except RunnerMismatchError:
            raise  # --runner generate: to_openai_error's 400, param model
        except ValueError as e:  # the engine's checks: the hidden size bounds dimensions
            param = "dimensions" if str(e).startswith("dimensions") else "input"
            raise OpenAIError(str(e), 400, param) from e
        data = [EmbeddingData(index=i, embedding=_encode(f.outputs.embedding,
                                                         req.encoding_format))
                for i, f in enumerate(finals)]
        num_tokens = sum(len(token_ids) for _, token_ids in inputs)
        return JSONResponse(EmbeddingResponse(
            data=data, model=req.model or self.model_name,
            usage=EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
        ).model_dump())

    def _tokenize_inputs(self, value) -> list[tuple[str | None, list[int]]]:
        """The input field's four shapes as (text or None, token ids) pairs; an empty text
        or token list is a 400 (OpenAI's), as is one longer than the context."""
        if isinstance(value, str) or (value and isinstance(value[0], int)):
            value = [value]
        if not value:
            raise OpenAIError("input must not be empty", 400, "input")
        self.check_limit("input", len(value), "max_prompts_per_request")
        inputs = []
        for item in value:
            if isinstance(item, str) and not item:
                raise OpenAIError("input must not contain an empty string", 400, "input")
            token_ids = self.encode(item, "input") if isinstance(item, str) else list(item)
            self.check_token_ids(token_ids, "input")
            self.check_context(len(token_ids), 0, "input")
            inputs.append((item if isinstance(item, str) else None, token_ids))
        return inputs


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    """OpenAI's base64: the vector's float32 values, little-endian, base64-encoded."""
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
