"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from http import HTTPStatus

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from minivllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse

MAX_MESSAGE_CHARS = 500  # never echo a huge input back

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class OpenAIError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


def error_body(message: str, status: int, param: str | None = None) -> ErrorResponse:
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "..."
    error_type = _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return ErrorResponse(error=ErrorInfo(message=message, type=error_type, param=param,
                                         code=status))


def error_response(message: str, status: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param).model_dump(), status_code=status)


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


def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
    return error_response(exc.message, exc.status, exc.param)


def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette still logs the traceback; the client gets the OpenAI shape, not plain text.
    return error_response(f"internal server error: {type(exc).__name__}", 500)


def install_error_handlers(app) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(OpenAIError, _openai_error)
    app.add_exception_handler(Exception, _internal_error)
