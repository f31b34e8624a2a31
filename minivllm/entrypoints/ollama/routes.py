"""Ollama's routes, /api/*: generation, embeddings and the model's description over the
OpenAI serving objects; the endpoints that manage model files answer 501; every error,
validation included, in Ollama's shape (errors.py's OllamaRoute)."""

from __future__ import annotations

import time
from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import PlainTextResponse

from minivllm.entrypoints.ollama.embed import OllamaServingEmbed
from minivllm.entrypoints.ollama.errors import OllamaRoute, ollama_error
from minivllm.entrypoints.ollama.models import OllamaServingModels
from minivllm.entrypoints.ollama.names import resolve
from minivllm.entrypoints.ollama.protocol import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    ShowRequest,
)
from minivllm.entrypoints.ollama.serving import OllamaServingGeneration
from minivllm.entrypoints.openai.streaming import cancel_on_disconnect

FILE_ENDPOINTS = {"/api/pull": "POST", "/api/push": "POST", "/api/create": "POST",
                  "/api/copy": "POST", "/api/delete": "DELETE"}


def add_ollama_routes(app: FastAPI, engine, base, completions, chat, embeddings,
                      args) -> None:
    """Ollama's endpoints on `app` (the OpenAI serving objects do the work)."""
    models = OllamaServingModels(engine, base, chat, base.models)
    generation = OllamaServingGeneration(completions, chat)
    embed = OllamaServingEmbed(embeddings)
    router = APIRouter(route_class=OllamaRoute)

    def received(raw: Request) -> float:
        return getattr(raw.state, "received", None) or time.time()

    @router.post("/api/chat")
    async def chat_route(req: ChatRequest, raw: Request) -> Response:
        served = resolve(req.model, models.served())
        return await cancel_on_disconnect(raw, generation.chat_(req, served, received(raw)))

    @router.post("/api/generate")
    async def generate_route(req: GenerateRequest, raw: Request) -> Response:
        served = resolve(req.model, models.served())
        return await cancel_on_disconnect(raw, generation.generate(req, served,
                                                                   received(raw)))

    @router.post("/api/embed")
    async def embed_route(req: EmbedRequest, raw: Request) -> Response:
        served = resolve(req.model, models.served())
        return await cancel_on_disconnect(raw, embed.embed(req, served, received(raw)))

    @router.post("/api/embeddings")
    async def embeddings_route(req: EmbeddingsRequest, raw: Request) -> Response:
        served = resolve(req.model, models.served())
        return await cancel_on_disconnect(raw, embed.embeddings_(req, served))

    @router.get("/api/tags")
    async def tags() -> dict:
        return await models.tags()

    @router.get("/api/ps")
    async def ps() -> dict:
        return await models.ps()

    @router.post("/api/show")
    async def show(req: ShowRequest) -> dict:
        served = resolve(req.model or req.name, models.served())
        return await models.show(served, req.verbose)

    # Ollama's heartbeat: its CLI asks HEAD / before anything (OLLAMA_HOST=... ollama run),
    # and some clients read the text of GET /. Its own words: they are the protocol's.
    @router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def heartbeat() -> Response:
        return PlainTextResponse("Ollama is running")

    @router.get("/api/version")
    async def show_version() -> dict:
        try:
            return {"version": version("minivllm")}
        except PackageNotFoundError:  # a source tree that was never installed
            return {"version": "unknown"}

    def refuse_files(path: str, method: str) -> None:
        async def refuse() -> Response:
            return ollama_error(f"{path} is not served: minivllm serves the model files it "
                                "was started with (minivllm serve FILE.gguf); it does not "
                                "pull, push, create, copy or delete models", 501)

        router.add_api_route(path, refuse, methods=[method])

    for path, method in FILE_ENDPOINTS.items():
        refuse_files(path, method)
    known = {route.path for route in router.routes}

    # Last: the rest of /api/* (the app's own 404 and 405 answer in OpenAI's shape)
    @router.api_route("/api/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH",
                                                    "HEAD"], include_in_schema=False)
    async def unknown(raw: Request) -> Response:
        if raw.url.path in known:
            return ollama_error(f"method {raw.method} not allowed on {raw.url.path}", 405)
        return ollama_error(f"no such endpoint: {raw.url.path[:100]}", 404)

    app.include_router(router)
