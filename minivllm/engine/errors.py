"""Why the engine did not (or could not) serve a request. The HTTP layer maps each class to a
status code (entrypoints/openai/errors.py); the engine itself knows nothing of HTTP."""

from __future__ import annotations


class EngineOverloadedError(RuntimeError):
    """The engine turned a new request away: a queue bound is reached or it is shutting down.
    Nothing was queued; the same request may succeed later. `reason` names the bound (it is
    the label of vllm:num_requests_rejected_total)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class EngineDeadError(RuntimeError):
    """The engine loop stopped (an unexpected error or shutdown): nothing more is generated."""


class RequestFailedError(RuntimeError):
    """The engine failed this one request; the others go on."""


class RequestTimeoutError(RequestFailedError):
    """The request waited in the queue, never scheduled, longer than request_timeout."""


class RunnerMismatchError(ValueError):
    """A request of a kind this engine does not serve: a generation request under --runner
    pooling, a pooling request (embeddings) under --runner generate."""
