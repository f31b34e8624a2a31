"""The request and response models of structured outputs and tool calls (OpenAI's and vLLM's
spellings): response_format, vLLM's structured_outputs object, tools, tool_choice, and
tool_calls in messages, responses and stream deltas."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class JsonSchemaResponseFormat(_Model):
    name: str = "response"
    description: str | None = None
    # "schema" is a BaseModel attribute: the field keeps OpenAI's name through an alias
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaResponseFormat | None = None


class StructuredOutputsRequest(_Model):
    """vLLM's `structured_outputs` object (one of its fields set)."""

    json_: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None


class FunctionDefinition(_Model):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatCompletionToolsParam(_Model):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ToolChoiceFunction(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"] = "function"
    function: ToolChoiceFunction


class FunctionCall(_Model):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


def tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


class ToolCall(_Model):
    id: str = Field(default_factory=tool_call_id)
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(_Model):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Model):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None
