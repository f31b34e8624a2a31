"""ASGI middleware: API-key check, header and body size limits, answering in OpenAI's shape
(Ollama's under /api/)."""

from __future__ import annotations

import base64
import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minivllm.entrypoints.openai.errors import error_response_for


class ApiKeyMiddleware:
    """Every route but the open ones (/health, and /metrics unless --metrics-require-key)
    needs `Authorization: Bearer <key>`. Under `browser_prefixes` (the dashboard) HTTP Basic
    with the key as password does too, and a 401 asks for it: a browser cannot add a Bearer
    header to a page it navigates to, nor to an EventSource, but it prompts for Basic
    credentials once and then sends them with every request the page makes."""

    def __init__(self, app: ASGIApp, api_key: str, open_paths: tuple[str, ...],
                 browser_prefixes: tuple[str, ...] = ()) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.api_key = api_key.encode()
        self.open_paths = open_paths
        self.browser_prefixes = browser_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in self.open_paths:
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        browser = path.startswith(self.browser_prefixes) if self.browser_prefixes else False
        if not (hmac.compare_digest(given, self.expected)
                or (browser and self._basic_ok(given))):
            message = "missing API key" if not given else "invalid API key"
            challenge = {"WWW-Authenticate": 'Basic realm="minivllm"'} if browser else None
            return await error_response_for(scope, message, 401, headers=challenge)(
                scope, receive, send)
        await self.app(scope, receive, send)

    def _basic_ok(self, given: bytes) -> bool:
        """`Basic base64(any user:KEY)`."""
        scheme, _, encoded = given.partition(b" ")
        if scheme.lower() != b"basic":
            return False
        try:
            _, _, password = base64.b64decode(encoded, validate=True).partition(b":")
        except ValueError:
            return False
        return hmac.compare_digest(password, self.api_key)


class HeaderSizeLimitMiddleware:
    """431 for a request line plus headers over the limit (uvicorn's h11 parser buffers a
    few times more, so that this answer, not its bare 400, is what such a client sees)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or b"") + len(scope.get("query_string", b""))
            size += sum(len(name) + len(value) + 4 for name, value in scope["headers"])
            if size > self.max_bytes:
                too_large = error_response_for(
                    scope, f"request line and headers are larger than {self.max_bytes} bytes "
                    "(see --max-header-kb)", 431)
                return await too_large(scope, receive, send)
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
            too_large = error_response_for(
                scope, f"request body is larger than {self.max_bytes} bytes "
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
