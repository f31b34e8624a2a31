"""A /v1/responses request as the chat completion request it amounts to: its input items (and
the stored conversation previous_response_id continues) as chat messages, its text.format as
response_format, its function tools and tool_choice in chat's shapes. Errors that chat's
checks raise are renamed to the Responses field the client sent (max_tokens is
max_output_tokens here, messages is input, ...)."""

from __future__ import annotations

from minivllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.protocol import ChatMessage
from minivllm.entrypoints.openai.protocol_tools import (
    ChatCompletionToolsParam,
    FunctionCall,
    FunctionDefinition,
    JsonSchemaResponseFormat,
    NamedToolChoice,
    ResponseFormat,
    ToolCall,
    ToolChoiceFunction,
)
from minivllm.entrypoints.openai.responses.protocol import (
    FunctionCallInput,
    FunctionCallItem,
    FunctionCallOutputInput,
    InputMessage,
    OutputItem,
    OutputMessage,
    ResponsesRequest,
)

# chat's field -> the Responses request's
_FIELDS = {"messages": "input", "max_tokens": "max_output_tokens",
           "response_format.json_schema.schema": "text.format.schema",
           "response_format": "text.format"}


def renamed(err: OpenAIError) -> OpenAIError:
    """A chat error about a field, about the Responses field it came from."""
    field = _FIELDS.get(err.param or "")
    if field is None:
        return err
    message = err.message.replace(err.param, field, 1) if err.message.startswith(err.param) \
        else err.message
    return OpenAIError(message, err.status, field)


def _add_call(messages: list[ChatMessage], call: ToolCall) -> None:
    """A call joins the assistant message before it (its text and its other calls, as chat
    templates want them), else opens one."""
    last = messages[-1] if messages else None
    if last is None or last.role != "assistant":
        last = ChatMessage(role="assistant", content=None, tool_calls=[])
        messages.append(last)
    last.tool_calls = [*(last.tool_calls or []), call]


def input_messages(req: ResponsesRequest) -> list[ChatMessage]:
    """The request's input as chat messages (reasoning items are left out, as chat templates
    leave out past thinking)."""
    if isinstance(req.input, str):
        return [ChatMessage(role="user", content=req.input)]
    messages: list[ChatMessage] = []
    for item in req.input:
        if isinstance(item, InputMessage):
            role = "system" if item.role == "developer" else item.role
            messages.append(ChatMessage(role=role, content=item.text()))
        elif isinstance(item, FunctionCallInput):
            _add_call(messages, ToolCall(id=item.call_id, function=FunctionCall(
                name=item.name, arguments=item.arguments)))
        elif isinstance(item, FunctionCallOutputInput):
            messages.append(ChatMessage(role="tool", content=item.output,
                                        tool_call_id=item.call_id))
    return messages


def output_messages(output: list[OutputItem]) -> list[ChatMessage]:
    """A response's output as the assistant turn of the next request's conversation."""
    messages: list[ChatMessage] = []
    for item in output:
        if isinstance(item, OutputMessage):
            messages.append(ChatMessage(role="assistant",
                                        content="".join(part.text for part in item.content)))
        elif isinstance(item, FunctionCallItem):
            _add_call(messages, ToolCall(id=item.call_id, function=FunctionCall(
                name=item.name, arguments=item.arguments)))
    return messages


def _response_format(req: ResponsesRequest) -> ResponseFormat | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaResponseFormat(
        name=fmt.name, description=fmt.description, schema=fmt.json_schema, strict=fmt.strict))


def chat_request(req: ResponsesRequest, messages: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat completion request that generates this response from `messages`."""
    tools = [ChatCompletionToolsParam(function=FunctionDefinition(
        name=t.name, description=t.description, parameters=t.parameters, strict=t.strict))
        for t in req.tools] if req.tools else None
    # Unset, chat's default: "auto" on a server with a tool parser, else text only
    choice = req.tool_choice
    if choice is not None and not isinstance(choice, str):
        choice = NamedToolChoice(function=ToolChoiceFunction(name=choice.name))
    if not messages:
        raise OpenAIError("input: nothing to answer (reasoning items alone)", 400, "input")
    return ChatCompletionRequest(
        model=req.model, messages=messages, max_tokens=req.max_output_tokens,
        temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
        repetition_penalty=req.repetition_penalty, seed=req.seed, stop=req.stop,
        stream=req.stream, user=req.user, priority=req.priority, cache_salt=req.cache_salt,
        response_format=_response_format(req), tools=tools, tool_choice=choice,
        parallel_tool_calls=req.parallel_tool_calls)
