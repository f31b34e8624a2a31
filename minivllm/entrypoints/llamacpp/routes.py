"""llama-server's routes (being built: issue 71)."""

from __future__ import annotations

from fastapi import FastAPI


def add_llamacpp_routes(app: FastAPI, engine, base, completions, chat, embeddings,
                        args) -> None:
    """llama-server's endpoints on `app` (the OpenAI serving objects do the work)."""
