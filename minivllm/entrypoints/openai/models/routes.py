"""The models the server answers to: the registry built from the flags (--enable-lora,
--lora-modules), GET /v1/models, and vLLM's two runtime endpoints for LoRA adapters,
POST /v1/load_lora_adapter and /v1/unload_lora_adapter (serving.py says when they are
allowed)."""

from __future__ import annotations

import time

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.models.serving import (
    RUNTIME_UPDATING_ENV,
    LoadLoRAAdapterRequest,
    OpenAIServingModels,
    UnloadLoRAAdapterRequest,
    parse_lora_module,
    runtime_updating_allowed,
)


def serving_models(engine, args) -> OpenAIServingModels:
    """The base model and the adapters --lora-modules names (a bad one: ValueError)."""
    config = engine.config
    modules = tuple(parse_lora_module(m) for m in getattr(args, "lora_modules", None) or ())
    hf_config, max_rank = None, None
    if config.lora_config.enable_lora:
        from transformers import AutoConfig

        from minivllm.model.loader import resolve_model_path

        hf_config = AutoConfig.from_pretrained(resolve_model_path(config.model, config.revision))
        max_rank = config.lora_config.max_lora_rank
    return OpenAIServingModels(config.model_name, config.model, engine.max_model_len,
                               hf_config, max_rank, modules)


def add_models_routes(app: FastAPI, models: OpenAIServingModels, args) -> None:
    """GET /v1/models, and the LoRA routes (`args.allow_runtime_lora_updating`: allowed)."""
    created = int(time.time())

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": models.cards(created)}

    add_lora_routes(app, models, runtime_updating_allowed(
        getattr(args, "allow_runtime_lora_updating", False)))


def add_lora_routes(app: FastAPI, models: OpenAIServingModels, allowed: bool) -> None:
    def check_allowed() -> None:
        if not allowed:
            raise OpenAIError("runtime LoRA updating is off: start the server with "
                              f"--allow-runtime-lora-updating (or {RUNTIME_UPDATING_ENV}=True)",
                              403)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(req: LoadLoRAAdapterRequest) -> PlainTextResponse:
        check_allowed()
        if req.lora_name in models.lora_requests or req.lora_name == models.base_model_name:
            raise OpenAIError(f"The lora adapter '{req.lora_name}' has already been loaded.",
                              400, "lora_name")
        try:
            models.load(req.lora_name, req.lora_path)
        except ValueError as e:
            raise OpenAIError(str(e), 400, "lora_path") from None
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(req: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        check_allowed()
        if req.lora_name not in models.lora_requests:
            raise OpenAIError(f"The lora adapter '{req.lora_name}' cannot be found.", 404,
                              "lora_name")
        models.unload(req.lora_name)
        return PlainTextResponse(
            f"Success: LoRA adapter '{req.lora_name}' removed successfully.")
