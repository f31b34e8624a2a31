"""The routes of the Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}."""

from __future__ import annotations

from fastapi import FastAPI, Request, Response

from minivllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from minivllm.entrypoints.openai.responses.protocol import ResponsesRequest
from minivllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from minivllm.entrypoints.openai.responses.store import DEFAULT_STORE_SIZE, ResponseStore
from minivllm.entrypoints.openai.streaming import cancel_on_disconnect


def add_responses_routes(app: FastAPI, chat: OpenAIServingChat, args) -> None:
    """`chat`: the chat endpoint's serving (its template, tool and reasoning parsers);
    `args.responses_store_size`: how many responses are kept."""
    store = ResponseStore(getattr(args, "responses_store_size", DEFAULT_STORE_SIZE))
    responses = OpenAIServingResponses(chat, store)

    @app.post("/v1/responses")
    async def create_response(req: ResponsesRequest, raw: Request) -> Response:
        return await cancel_on_disconnect(raw, responses.create(req))

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str) -> dict:
        return responses.retrieve(response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> dict:
        return responses.delete(response_id)
