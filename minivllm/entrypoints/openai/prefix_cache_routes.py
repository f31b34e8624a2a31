"""vLLM's POST /reset_prefix_cache: the operator clears the prefix cache without a restart.

`reset_external=true` also deletes the disk tier's block files (--kv-offloading-backend
disk), vLLM's "external" prefix cache. Running requests are never touched: their blocks stay
theirs (EngineCore.reset_prefix_cache), so `reset_running_requests=true` (vLLM preempts
them, to recompute their KV after a weight update) is refused: minivllm has no such update.
"""

from __future__ import annotations

from fastapi import FastAPI, Query
from fastapi.responses import Response

from minivllm.entrypoints.openai.errors import OpenAIError


def add_prefix_cache_routes(app: FastAPI, engine) -> None:
    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(reset_running_requests: bool = Query(default=False),
                                 reset_external: bool = Query(default=False)) -> Response:
        if reset_running_requests:
            raise OpenAIError("reset_running_requests=true is not supported: a reset never "
                              "touches running requests (their blocks stay valid, no longer "
                              "shared)", 400, "reset_running_requests")
        try:
            await engine.reset_prefix_cache(reset_external)
        except NotImplementedError as e:
            raise OpenAIError(str(e), 501) from None
        return Response(status_code=200)  # vLLM's answer: no body
