"""Errors on /api/* in Ollama's shape, {"error": "message"}, whatever raised them: a body
FastAPI could not validate, an OpenAIError from the serving objects underneath, an engine
error. OllamaRoute catches them inside each /api/* route, before the app's handlers (which
answer in OpenAI's shape for the OpenAI routes) see them."""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from minivllm.entrypoints.openai.errors import (
    MAX_MESSAGE_CHARS,
    OpenAIError,
    log_if_unexpected,
    to_openai_error,
)

# The OpenAI fields the serving objects name in their errors, as Ollama's request spells them.
OLLAMA_NAMES = {"max_tokens": "options.num_predict", "temperature": "options.temperature",
                "top_k": "options.top_k", "top_p": "options.top_p", "min_p": "options.min_p",
                "repetition_penalty": "options.repeat_penalty", "seed": "options.seed",
                "presence_penalty": "options.presence_penalty", "stop": "options.stop",
                "frequency_penalty": "options.frequency_penalty",
                "response_format": "format", "response_format.json_schema.schema": "format"}


def ollama_error(message: str, status: int, headers: dict[str, str] | None = None
                 ) -> JSONResponse:
    if len(message) > MAX_MESSAGE_CHARS:  # never echo a huge input back
        message = message[:MAX_MESSAGE_CHARS] + "..."
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def validation_message(exc: RequestValidationError) -> str:
    first = exc.errors()[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return f"invalid JSON body: {first.get('ctx', {}).get('error', '')}".rstrip(": ")
    if not loc:
        return "the body must be a JSON object"
    return f"{'.'.join(loc)}: {first.get('msg', 'invalid value')}"


def error_message(err: OpenAIError) -> str:
    """The message, with the OpenAI field it names put as the Ollama field it came from."""
    name = OLLAMA_NAMES.get(err.param or "")
    if name is None:
        return err.message
    message = err.message
    if message.startswith(err.param):
        message = message[len(err.param):].lstrip(": ")
    return f"{name}: {message}"


def to_ollama_response(exc: Exception) -> JSONResponse:
    if isinstance(exc, RequestValidationError):
        return ollama_error(validation_message(exc), 400)
    if isinstance(exc, HTTPException):
        return ollama_error(str(exc.detail), exc.status_code)
    log_if_unexpected(exc)
    err = to_openai_error(exc)
    return ollama_error(error_message(err), err.status, err.headers)


def error_line(exc: Exception) -> bytes:
    """The NDJSON line that ends a stream which failed after it started (Ollama's)."""
    log_if_unexpected(exc)
    message = error_message(to_openai_error(exc))[:MAX_MESSAGE_CHARS]
    return json.dumps({"error": message}).encode() + b"\n"


class OllamaRoute(APIRoute):
    """An APIRoute whose errors, validation included, answer in Ollama's shape, and whose
    body is JSON."""

    def get_route_handler(self) -> Callable[[Request], Response]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            # Ollama reads every body as JSON, whatever its Content-Type (its docs' `curl -d`
            # sends a form's): FastAPI parses a body as JSON only when told it is.
            headers = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"]
            request.scope["headers"] = [*headers, (b"content-type", b"application/json")]
            request.__dict__.pop("_headers", None)
            try:
                return await handler(request)
            except Exception as e:  # noqa: BLE001 - every error becomes an answer
                return to_ollama_response(e)

        return route
