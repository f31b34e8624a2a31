"""Where a streamed request's time to first token went, as the server saw it: the `timing`
object of a stream's usage chunk (a minivllm extension; OpenAI clients ignore the field).

    received ──frontend_in──▶ arrival ──queue──▶ first scheduled ──prefill──▶ first token
             ──frontend_out──▶ first token's chunk handed to the HTTP stream

received: the request reached the HTTP server (ReceivedTimeMiddleware); frontend_in: the
body parsed and validated, the prompt tokenized, the request built (to the engine's arrival
time); queue: waiting to be scheduled; prefill: the engine steps from the first scheduled
one to the end of the step that sampled the first token (the request's prompt chunks and
whatever else those steps computed: prefill_steps, prefill_step_tokens); frontend_out: the
token's way back to the frontend process, detokenizing, and the chunk built. What a client
measures past these (its own TTFT minus server_ttft_s) is the HTTP transfer both ways. All
are time.time() differences on the server's clock, in seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from minivllm.outputs import RequestMetrics

PARTS = ("frontend_in_s", "queue_s", "prefill_s", "frontend_out_s")  # they add up to TTFT


class ReceivedTimeMiddleware:
    """Stamps each HTTP request with the time it reached the server: request.state.received."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})["received"] = time.time()
        await self.app(scope, receive, send)


class FirstTokenTiming:
    """A stream's timing: the engine's metrics of its (first prompt's) request and when the
    chunk with the first token was handed to the HTTP stream."""

    def __init__(self, received: float | None,
                 sink: Callable[[dict], None] | None = None) -> None:
        """`sink` gets the parts once the first token is sent (the dashboard's hub)."""
        self.received = received if received is not None else time.time()
        self.sink = sink
        self.metrics: RequestMetrics | None = None
        self.first_sent: float | None = None

    def token_sent(self, metrics: RequestMetrics | None) -> None:
        """A chunk with a token is being yielded (`metrics`: its request's)."""
        if self.first_sent is None:
            self.first_sent, self.metrics = time.time(), metrics
            parts = self.as_dict()
            if self.sink is not None and parts is not None:
                self.sink(parts)

    def as_dict(self) -> dict | None:
        m = self.metrics
        if (m is None or self.first_sent is None or m.first_scheduled_time is None
                or m.first_token_time is None):
            return None
        return {"frontend_in_s": m.arrival_time - self.received,
                "queue_s": m.first_scheduled_time - m.arrival_time,
                "prefill_s": m.first_token_time - m.first_scheduled_time,
                "frontend_out_s": self.first_sent - m.first_token_time,
                "server_ttft_s": self.first_sent - self.received,
                "prefill_steps": m.prefill_steps,
                "prefill_step_tokens": m.prefill_step_tokens}


def sse_with_timing(payload, timing: FirstTokenTiming) -> str:
    """A usage chunk as an SSE event, with the `timing` object when there is one."""
    body = payload.model_dump(mode="json")
    parts = timing.as_dict()
    if parts is not None:
        body["timing"] = parts
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"
