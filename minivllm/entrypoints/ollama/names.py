"""Ollama's model names, `name:tag` (the tag "latest" when left out), resolved to a name
this server serves: the served model name (--served-model-name, else the path it was started
with) or a LoRA adapter's."""

from __future__ import annotations

from minivllm.entrypoints.openai.errors import OpenAIError


def split_tag(name: str) -> tuple[str, str | None]:
    """("qwen2.5-coder", "0.5b") of "qwen2.5-coder:0.5b"; a colon before the last "/" (a
    registry's port) is not a tag's."""
    base, sep, tag = name.rpartition(":")
    if not sep or not base or "/" in tag:
        return name, None
    return base, tag


def resolve(name: str | None, served: list[str]) -> str:
    """The served name `name` means: itself, or the same name with its tag "latest" given
    or left out, or a bare name whose served form carries a tag; 404 for anything else."""
    if not name:
        raise OpenAIError("model is required", 400, "model")
    if name in served:
        return name
    base, tag = split_tag(name)
    for candidate in served:
        served_base, served_tag = split_tag(candidate)
        if base == served_base and (tag is None or (tag or "latest") == (served_tag or "latest")):
            return candidate
    raise OpenAIError(f'model "{name}" not found: this server serves '
                      f'{", ".join(repr(s) for s in served)} (minivllm serves the model it '
                      "was started with; --served-model-name names it)", 404, "model")
