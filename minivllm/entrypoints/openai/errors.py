"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from minivllm.engine.errors import (
    EngineDeadError,
    EngineOverloadedError,
    RequestFailedError,
    RequestTimeoutError,
    RunnerMismatchError,
)
from minivllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse

logger = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 500  # never echo a huge input back
RETRY_AFTER_S = 1  # what a 503 for a full queue or a shutdown tells the client to wait

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    431: "RequestHeaderFieldsTooLargeError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class OpenAIError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.headers = headers


def error_body(message: str, status: int, param: str | None = None) -> ErrorResponse:
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "..."
    error_type = _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return ErrorResponse(error=ErrorInfo(message=message, type=error_type, param=param,
                                         code=status))


def error_response(message: str, status: int, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param).model_dump(), status_code=status,
                        headers=headers)


# Ollama's routes (entrypoints/ollama) answer {"error": "message"}; the middleware's answers,
# given before any route, take that shape there too.
OLLAMA_PREFIX = "/api/"


def error_response_for(scope, message: str, status: int,
                       headers: dict[str, str] | None = None) -> JSONResponse:
    """The middleware's error answer, in the shape of the API the request's path belongs to."""
    if scope.get("path", "").startswith(OLLAMA_PREFIX):
        return JSONResponse({"error": error_body(message, status).error.message},
                            status_code=status, headers=headers)
    return error_response(message, status, headers=headers)


def to_openai_error(exc: Exception) -> OpenAIError:
    """Any exception a handler or a stream meets, as the error its client gets."""
    retry_later = {"Retry-After": str(RETRY_AFTER_S)}
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, EngineOverloadedError):
        return OpenAIError(f"server overloaded: {exc}", 503, headers=retry_later)
    if isinstance(exc, RequestTimeoutError):
        return OpenAIError(str(exc), 503, headers=retry_later)
    if isinstance(exc, RequestFailedError):
        return OpenAIError(f"the engine failed this request: {exc}", 500)
    if isinstance(exc, EngineDeadError):
        return OpenAIError(str(exc), 503)
    if isinstance(exc, RunnerMismatchError):  # as OpenAI's "not a chat model": param model
        return OpenAIError(str(exc), 400, "model")
    if isinstance(exc, ValueError):  # the engine rejected the input
        return OpenAIError(str(exc), 400)
    return OpenAIError(f"internal server error: {type(exc).__name__}: {exc}", 500)


# Errors that are part of serving, not bugs: their handler answers without a traceback.
EXPECTED_ERRORS = (OpenAIError, EngineOverloadedError, RequestFailedError, EngineDeadError,
                   ValueError)


def log_if_unexpected(exc: Exception) -> None:
    if not isinstance(exc, EXPECTED_ERRORS):
        logger.error("request failed", exc_info=exc)


def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return error_response(f"invalid JSON body: {detail}".rstrip(": "), 400)
    if not loc:
        return error_response("the body must be a JSON object (with Content-Type: "
                              "application/json)", 400)
    # The first name is the field a client can fix; the rest locates it inside lists.
    param = loc[0]
    return error_response(f"{'.'.join(loc)}: {first.get('msg', 'invalid value')}", 400, param)


def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return error_response(str(exc.detail), exc.status_code)


def _any_error(request: Request, exc: Exception) -> JSONResponse:
    err = to_openai_error(exc)
    return error_response(err.message, err.status, err.param, err.headers)


def install_error_handlers(app) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    for error_class in EXPECTED_ERRORS:
        app.add_exception_handler(error_class, _any_error)
    # Anything else is a bug: Starlette logs its traceback after this handler answers.
    app.add_exception_handler(Exception, _any_error)
