"""Request and response models of POST /v1/responses (OpenAI's Responses API, its field names;
the shapes of openai.types.responses). Input items: messages (a string or input_text parts),
function_call and function_call_output items (a tool round trip sent back), reasoning items
(accepted and left out of the prompt). Only function tools."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# ---- request ------------------------------------------------------------------------------


class InputTextPart(_Model):
    # output_text: an assistant message sent back as the API wrote it
    type: Literal["input_text", "output_text", "text"]
    text: str


class InputMessage(_Model):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputTextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class FunctionCallInput(_Model):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputInput(_Model):
    type: Literal["function_call_output"]
    call_id: str
    output: str


class ReasoningInput(_Model):
    type: Literal["reasoning"]


def _item_type(value: Any) -> str:
    """An item's kind; a message may leave out its type (OpenAI's EasyInputMessage)."""
    if isinstance(value, dict):
        return value.get("type", "message")
    return getattr(value, "type", "message")


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")] | Annotated[FunctionCallInput, Tag("function_call")]
    | Annotated[FunctionCallOutputInput, Tag("function_call_output")]
    | Annotated[ReasoningInput, Tag("reasoning")],
    Discriminator(_item_type),
]


class JsonSchemaFormat(_Model):
    type: Literal["json_schema"]
    name: str = "response"
    description: str | None = None
    # "schema" is a BaseModel attribute: the field keeps OpenAI's name through an alias
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class PlainFormat(_Model):
    type: Literal["text", "json_object"]


class TextConfig(_Model):
    format: Annotated[JsonSchemaFormat | PlainFormat, Field(discriminator="type")] | None = None


class FunctionTool(_Model):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(_Model):
    type: Literal["function"]
    name: str


class ResponsesRequest(_Model):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, allow_inf_nan=False)
    model: str | None = None
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool = True
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = Field(None, max_length=256)
    # vLLM's extras, as on the other endpoints
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    priority: int = 0
    cache_salt: str | None = None


# ---- response -----------------------------------------------------------------------------


class OutputText(_Model):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list = Field(default_factory=list)
    logprobs: list = Field(default_factory=list)


class OutputMessage(_Model):
    id: str = Field(default_factory=lambda: new_id("msg"))
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[OutputText] = Field(default_factory=list)


class ReasoningText(_Model):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(_Model):
    id: str = Field(default_factory=lambda: new_id("rs"))
    type: Literal["reasoning"] = "reasoning"
    summary: list = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class FunctionCallItem(_Model):
    id: str = Field(default_factory=lambda: new_id("fc"))
    type: Literal["function_call"] = "function_call"
    call_id: str = Field(default_factory=lambda: new_id("call"))
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


OutputItem = OutputMessage | ReasoningItem | FunctionCallItem


class InputTokensDetails(_Model):
    cached_tokens: int = 0


class OutputTokensDetails(_Model):
    reasoning_tokens: int = 0


class ResponseUsage(_Model):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(_Model):
    reason: Literal["max_output_tokens"]


class ResponseObject(_Model):
    id: str = Field(default_factory=lambda: new_id("resp"))
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: Literal["in_progress", "completed", "incomplete", "failed"] = "in_progress"
    error: dict | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict | None = None
    store: bool = True
    temperature: float | None = None
    text: dict = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict = "auto"
    tools: list[dict] = Field(default_factory=list)
    top_p: float | None = None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
