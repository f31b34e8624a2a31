"""ASGI middleware: API-key check and request-body size limit, both answering in OpenAI's shape."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minivllm.entrypoints.openai.errors import error_response

UNPROTECTED_PATHS = ("/health",)


class ApiKeyMiddleware:
    """Every route but /health needs `Authorization: Bearer <key>`."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNPROTECTED_PATHS:
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, self.expected):
            message = "missing API key" if not given else "invalid API key"
            return await error_response(message, 401)(scope, receive, send)
        await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    """Reject bodies over the limit with 413 before the app parses anything.

    The body is read here (FastAPI would read it whole anyway) and replayed to the app;
    later receive() calls go to the server, so the app still hears about a disconnect.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            size += len(message.get("body", b""))
            # Past the limit keep draining without storing: a client still uploading when
            # the answer comes would see a broken pipe instead of the 413.
            if size <= self.max_bytes:
                chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        if size > self.max_bytes:
            too_large = error_response(f"request body is larger than {self.max_bytes} bytes "
                                       "(see --max-request-body-mb)", 413)
            return await too_large(scope, receive, send)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
