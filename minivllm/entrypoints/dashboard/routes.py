"""The dashboard's routes: GET /v1/engine/events (server-sent events, events.py) and, unless
--disable-dashboard, GET /dashboard, one static page whose script and styles are served from
/dashboard/static/ out of the package (no build step, no CDN: it works offline)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import Gauge

from minivllm.distributed.dp_metrics import DataParallelMetrics
from minivllm.engine.stat_loggers import PrometheusStatLogger
from minivllm.entrypoints.dashboard.events import EngineEventHub

STATIC_DIR = Path(__file__).parent / "static"
# Where the API-key check also takes HTTP Basic credentials (middleware.py): a browser's.
BROWSER_PATHS = ("/dashboard", "/v1/engine/events")
POLICY_FIELDS = ("scheduling_policy", "priority_aging_s", "length_predictor", "preemption_mode",
                 "active_preemption", "min_run_quantum")


def dashboard_config(engine) -> dict:
    """The `config` event: what the page shows as the policy and the engine settings."""
    settings = engine.config.to_kwargs()
    return {"model": engine.config.model_name, "max_model_len": engine.max_model_len,
            "policy": {k: settings[k] for k in POLICY_FIELDS if k in settings},
            "engine": settings}


def add_dashboard_routes(app: FastAPI, engine, interval: float, page: bool) -> EngineEventHub:
    """The events endpoint always; the page when `page`. The hub joins the engine's stat
    loggers, so it sees what /metrics sees (every replica's, under data parallel)."""
    hub = EngineEventHub(engine, dashboard_config(engine), interval)
    for prometheus in [s for s in engine.stat_loggers
                       if isinstance(s, (PrometheusStatLogger, DataParallelMetrics))]:
        Gauge("minivllm:dashboard_event_streams", "Clients of GET /v1/engine/events.",
              registry=prometheus.registry).set_function(lambda: len(hub.streams))
    engine.stat_loggers.append(hub)

    # Not in the OpenAPI document: a stream that never ends is no route to fuzz or crawl.
    @app.get("/v1/engine/events", include_in_schema=False)
    async def engine_events() -> StreamingResponse:
        return StreamingResponse(hub.stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    if page:
        @app.get("/dashboard", include_in_schema=False)
        async def dashboard() -> FileResponse:
            return FileResponse(STATIC_DIR / "index.html")

        app.mount("/dashboard/static", StaticFiles(directory=STATIC_DIR), name="dashboard")
    return hub
