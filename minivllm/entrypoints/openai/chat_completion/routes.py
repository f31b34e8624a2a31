"""The route of the chat completions API: POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import FastAPI, Request, Response

from minivllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from minivllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from minivllm.entrypoints.openai.streaming import cancel_on_disconnect


def add_chat_completion_routes(app: FastAPI, chat: OpenAIServingChat) -> None:
    @app.post("/v1/chat/completions")
    async def create_chat_completion(req: ChatCompletionRequest, raw: Request) -> Response:
        return await cancel_on_disconnect(raw, chat.create(req, raw.state.received))
