"""Ollama's routes (being built: issue 71)."""

from __future__ import annotations

from fastapi import FastAPI


def add_ollama_routes(app: FastAPI, engine, base, completions, chat, embeddings,
                      args) -> None:
    """Ollama's endpoints on `app` (the OpenAI serving objects do the work)."""
