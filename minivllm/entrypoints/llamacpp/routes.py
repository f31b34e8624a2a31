"""llama-server's routes: POST /completion (and /completions), POST /infill, GET /props,
GET /slots. /tokenize and /detokenize answer its form at vLLM's routes (openai/tokenization)
and /health its answer (api_server.py). Errors are in its shape (errors.py)."""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from minivllm.entrypoints.llamacpp import slots as seats
from minivllm.entrypoints.llamacpp.errors import error_response, read_body
from minivllm.entrypoints.llamacpp.fim import eog_token_ids, find_fim_tokens, gguf_path
from minivllm.entrypoints.llamacpp.protocol import CompletionRequest, InfillRequest
from minivllm.entrypoints.llamacpp.serving import LlamaServing
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.streaming import cancel_on_disconnect
from minivllm.model.loader import resolve_model_path

logger = logging.getLogger(__name__)


def model_gguf(engine) -> Path | None:
    """The served model's GGUF file, if it is one."""
    model = engine.config.model_config
    try:
        return gguf_path(resolve_model_path(model.model, model.revision))
    except (OSError, ValueError) as e:  # no model directory to read: the vocabulary alone
        logger.warning("reading the model's FIM tokens from its files failed: %s", e)
        return None


def add_llamacpp_routes(app: FastAPI, engine, base, completions, chat, embeddings,
                        args) -> None:
    """llama-server's endpoints on `app` (the OpenAI serving objects do the work)."""
    gguf = model_gguf(engine)
    fim = find_fim_tokens(base.tokenizer, gguf)  # the file's metadata, else the vocabulary
    model_ftype = seats.file_type(gguf)
    eog = eog_token_ids(base.tokenizer, fim)
    completions.fim, completions.fim_stop_token_ids = fim, tuple(eog)
    max_num_seqs = engine.config.max_num_seqs
    serving = LlamaServing(base, fim, eog, max_num_seqs)

    async def answer(raw: Request, model, handler) -> Response:
        try:
            req = await read_body(raw, model)
            return await cancel_on_disconnect(raw, handler(req))
        except Exception as e:  # every failure in llama-server's shape, never a traceback
            return error_response(e)

    @app.post("/completion")
    @app.post("/completions")
    async def completion(raw: Request) -> Response:
        return await answer(raw, CompletionRequest, serving.completion)

    @app.post("/infill")
    async def infill(raw: Request) -> Response:
        return await answer(raw, InfillRequest, serving.infill)

    @app.get("/props")
    async def props() -> dict:
        return seats.props(engine, base, engine.config.model_config.model, model_ftype,
                           max_num_seqs)

    @app.get("/slots")
    async def show_slots(fail_on_no_slot: int = 0) -> Response:
        table = seats.slots(engine, max_num_seqs)
        if fail_on_no_slot and all(s["is_processing"] for s in table):
            return error_response(OpenAIError("no slot available", 503))
        return JSONResponse(table)
