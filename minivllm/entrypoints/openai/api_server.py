"""The OpenAI-compatible HTTP API: a FastAPI app around an AsyncLLM (whichever client it
reaches its engine core(s) through). Each endpoint's protocol, serving and routes are in its
folder (completion/, chat_completion/, responses/, embedding/, models/, tokenization/); here
the app is put together, with the server's own routes (/health, /version, /metrics) and
its middleware."""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI, Response
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from minivllm.distributed.dp_metrics import DataParallelMetrics
from minivllm.engine.generation_defaults import describe, load_sampling_defaults
from minivllm.engine.stat_loggers import PrometheusStatLogger
from minivllm.entrypoints.dashboard.routes import BROWSER_PATHS, add_dashboard_routes
from minivllm.entrypoints.llamacpp.routes import add_llamacpp_routes
from minivllm.entrypoints.ollama.routes import add_ollama_routes
from minivllm.entrypoints.openai.chat_completion.cli_args import parsers_from_args
from minivllm.entrypoints.openai.chat_completion.routes import add_chat_completion_routes
from minivllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from minivllm.entrypoints.openai.completion.routes import add_completion_routes
from minivllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from minivllm.entrypoints.openai.embedding.routes import add_embedding_routes
from minivllm.entrypoints.openai.embedding.serving import OpenAIServingEmbedding
from minivllm.entrypoints.openai.errors import OpenAIError, error_response, install_error_handlers
from minivllm.entrypoints.openai.limits import RequestLimits
from minivllm.entrypoints.openai.middleware import (
    ApiKeyMiddleware,
    BodySizeLimitMiddleware,
    HeaderSizeLimitMiddleware,
)
from minivllm.entrypoints.openai.models.routes import add_models_routes, serving_models
from minivllm.entrypoints.openai.prefix_cache_routes import add_prefix_cache_routes
from minivllm.entrypoints.openai.request_timing import ReceivedTimeMiddleware
from minivllm.entrypoints.openai.responses.routes import add_responses_routes
from minivllm.entrypoints.openai.serving import OpenAIServing
from minivllm.entrypoints.openai.tokenization.routes import add_tokenization_routes

if TYPE_CHECKING:
    from minivllm.engine.async_llm import AsyncLLM

logger = logging.getLogger("minivllm.serve")


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a file, or (like vLLM) the Jinja template itself on one line."""
    if value is None:
        return None
    path = Path(value)
    if path.is_file():
        return path.read_text()
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"--chat-template: no such file: {value}")


def _package_version() -> str:
    try:
        return version("minivllm")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def build_app(engine: AsyncLLM, args) -> FastAPI:
    """The app; `args` carries the server flags (api_key, metrics_require_key,
    allowed_origins, chat_template, disable_dashboard, dashboard_interval and RequestLimits'
    fields); missing ones keep defaults."""
    model_name = engine.config.model_name
    chat_template = load_chat_template(getattr(args, "chat_template", None))
    limits = RequestLimits.from_args(args)
    defaults, source = load_sampling_defaults(engine.config)  # --generation-config
    logger.info(describe(defaults, source))
    base = OpenAIServing(engine, model_name, chat_template, limits, defaults)
    completions = OpenAIServingCompletion(engine, model_name, chat_template, limits, defaults)
    chat = OpenAIServingChat(engine, model_name, chat_template, limits, defaults)
    chat.tool_parser, chat.reasoning_parser = parsers_from_args(args)
    embeddings = OpenAIServingEmbedding(engine, model_name, chat_template, limits, defaults)
    models = serving_models(engine, args)
    base.models = completions.models = chat.models = embeddings.models = models
    # PrometheusStatLogger, or (data parallel) one with every replica's series
    prometheus = next((s for s in engine.stat_loggers
                       if isinstance(s, (PrometheusStatLogger, DataParallelMetrics))), None)

    app = FastAPI(title="minivllm OpenAI-compatible server", version=_package_version())
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        if not engine.is_running:
            return error_response(f"engine is not running: {engine.dead_reason}", 503)
        if engine.draining:
            return error_response("the server is shutting down", 503)
        states = engine.replica_states()  # data parallel; none with one engine core
        if states:
            up = all(s["state"] == "up" for s in states)
            return JSONResponse({"status": "ok" if up else "degraded", "replicas": states})
        return JSONResponse({"status": "ok"})  # llama-server's answer; vLLM's clients read 200

    @app.get("/version")
    async def show_version() -> dict:
        return {"version": _package_version()}

    add_models_routes(app, models, args)  # /v1/models, the LoRA adapters'

    @app.get("/metrics")
    async def metrics() -> Response:
        if prometheus is None:
            raise OpenAIError("metrics are not collected by this engine", 404)
        return Response(generate_latest(prometheus.registry), media_type=CONTENT_TYPE_LATEST)

    add_tokenization_routes(app, base)  # /tokenize, /tokenizer_info, /detokenize
    add_completion_routes(app, completions)
    add_chat_completion_routes(app, chat)
    add_embedding_routes(app, embeddings)
    add_responses_routes(app, chat, args)  # /v1/responses
    add_prefix_cache_routes(app, engine)  # /reset_prefix_cache
    add_llamacpp_routes(app, engine, base, completions, chat, embeddings, args)
    add_ollama_routes(app, engine, base, completions, chat, embeddings, args)  # /api/*

    hub = add_dashboard_routes(app, engine, getattr(args, "dashboard_interval", 1.0),
                               page=not getattr(args, "disable_dashboard", False))
    completions.ttft_sink = chat.ttft_sink = hub.record_ttft_parts

    # The last added is the outermost: headers are measured first, CORS answers preflights
    # (which carry no key) and labels every answer, then the key is checked, and only then
    # is a body read.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=limits.max_body_bytes)
    api_key = getattr(args, "api_key", None)
    if api_key:
        open_paths = ("/health",) if getattr(args, "metrics_require_key", False) \
            else ("/health", "/metrics")
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, open_paths=open_paths,
                           browser_prefixes=BROWSER_PATHS)
    origins = getattr(args, "allowed_origins", None)
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"],
                           allow_headers=["*"])
    app.add_middleware(HeaderSizeLimitMiddleware, max_bytes=limits.max_header_bytes)
    app.add_middleware(ReceivedTimeMiddleware)  # the outermost: it sees requests arrive
    return app

