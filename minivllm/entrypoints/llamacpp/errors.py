"""llama-server's error shape, {"error": {"code", "message", "type"}}, and its request
bodies read here (not by FastAPI) so that a malformed one is answered in that shape too."""

from __future__ import annotations

import json

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from minivllm.entrypoints.openai.errors import (
    MAX_MESSAGE_CHARS,
    OpenAIError,
    log_if_unexpected,
    to_openai_error,
)

# llama-server's error types by status (its format_error_response)
TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 500: "server_error", 501: "not_supported_error",
         503: "unavailable_error"}


def error_json(exc: Exception) -> tuple[dict, int, dict | None]:
    """Any exception as llama-server's error body, its status and headers."""
    log_if_unexpected(exc)
    err = to_openai_error(exc)
    message = err.message if len(err.message) <= MAX_MESSAGE_CHARS \
        else err.message[:MAX_MESSAGE_CHARS] + "..."
    error_type = TYPES.get(err.status, "invalid_request_error" if err.status < 500
                           else "server_error")
    return ({"error": {"code": err.status, "message": message, "type": error_type}},
            err.status, err.headers)


def error_response(exc: Exception) -> JSONResponse:
    body, status, headers = error_json(exc)
    return JSONResponse(body, status_code=status, headers=headers)


async def read_body(raw: Request, model: type[BaseModel]) -> BaseModel:
    """The request body as `model`, or OpenAIError(400) naming what is wrong."""
    body = await raw.body()
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise OpenAIError(f"invalid JSON body: {e}", 400) from e
    if not isinstance(data, dict):
        raise OpenAIError("the body must be a JSON object", 400)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise OpenAIError(f"{where}: {first['msg']}", 400, where) from e
