"""The route of the completions API: POST /v1/completions."""

from __future__ import annotations

from fastapi import FastAPI, Request, Response

from minivllm.entrypoints.openai.completion.protocol import CompletionRequest
from minivllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from minivllm.entrypoints.openai.streaming import cancel_on_disconnect


def add_completion_routes(app: FastAPI, completions: OpenAIServingCompletion) -> None:
    @app.post("/v1/completions")
    async def create_completion(req: CompletionRequest, raw: Request) -> Response:
        return await cancel_on_disconnect(raw, completions.create(req, raw.state.received))
