"""Request models of Ollama's API (its field names, docs/api.md in ollama/ollama). Fields
Ollama clients send that have no meaning here (num_gpu, num_thread, mirostat, ...) are
accepted and ignored, as Ollama ignores options a model does not use; `images` is refused
(serving.py): minivllm runs text models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from minivllm.entrypoints.openai.protocol_tools import ChatCompletionToolsParam

# keep_alive: "5m", 300, -1 ... accepted; the model stays loaded while the server runs.
KeepAlive = str | float | None


class OllamaModel(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)


class Options(OllamaModel):
    """The runtime options that map onto sampling (serving.py's OPTION_FIELDS) and num_ctx."""

    num_predict: int | None = None  # -1: until the context is full, as -2
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    stop: list[str] | None = None
    num_ctx: int | None = Field(None, ge=1)


class Function(OllamaModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)  # an object, not JSON text


class ToolCall(OllamaModel):
    function: Function


class Message(OllamaModel):
    role: str
    content: str | None = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None  # a tool message: the tool that answered


class GenerationRequest(OllamaModel):
    """What /api/chat and /api/generate share. `model` is required by Ollama; a missing one
    is a 400 naming it (routes.py), not a validation error of the body's shape."""

    model: str | None = None
    stream: bool = True
    format: str | dict[str, Any] | None = None  # "json" or a JSON schema
    options: Options = Field(default_factory=Options)
    keep_alive: KeepAlive = None
    think: bool | str | None = None


class ChatRequest(GenerationRequest):
    messages: list[Message] = Field(default_factory=list)
    tools: list[ChatCompletionToolsParam] | None = None


class GenerateRequest(GenerationRequest):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None  # a Go template (go_template.py), Ollama's TEMPLATE
    raw: bool = False
    context: list[int] | None = None  # the previous answer's, prepended (deprecated there)
    images: list[str] | None = None


class EmbedRequest(OllamaModel):
    model: str | None = None
    input: str | list[str]
    truncate: bool = True
    dimensions: int | None = None
    options: Options = Field(default_factory=Options)
    keep_alive: KeepAlive = None


class EmbeddingsRequest(OllamaModel):
    """The older /api/embeddings: one prompt, one embedding."""

    model: str | None = None
    prompt: str
    options: Options = Field(default_factory=Options)
    keep_alive: KeepAlive = None


class ShowRequest(OllamaModel):
    model: str | None = None
    name: str | None = None  # older clients' spelling of model
    verbose: bool = False
