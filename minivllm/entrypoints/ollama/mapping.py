"""Ollama's request fields as the OpenAI request fields the serving objects read: options
to sampling fields, format to response_format, messages and tools to chat messages."""

from __future__ import annotations

import json

from pydantic import ValidationError

from minivllm.entrypoints.ollama.protocol import Message, Options
from minivllm.entrypoints.openai.errors import OpenAIError

# Ollama option -> the OpenAI (vLLM) field it sets
OPTION_FIELDS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                 "min_p": "min_p", "repeat_penalty": "repetition_penalty", "seed": "seed",
                 "presence_penalty": "presence_penalty",
                 "frequency_penalty": "frequency_penalty", "stop": "stop"}
ROLES = ("system", "user", "assistant", "tool")


def sampling_fields(options: Options, max_model_len: int) -> dict:
    """The OpenAI request fields of `options`; num_ctx past the engine's length is a 400."""
    if options.num_ctx is not None and options.num_ctx > max_model_len:
        raise OpenAIError(f"options.num_ctx: {options.num_ctx} is more than this server's "
                          f"context length, {max_model_len} tokens (--max-model-len)", 400)
    fields = {field: getattr(options, name) for name, field in OPTION_FIELDS.items()
              if getattr(options, name) is not None}
    # num_predict -1 (infinite) and -2 (fill the context) both end at the context's end
    predict = options.num_predict
    fields["max_tokens"] = None if predict is None or predict < 0 else predict
    return fields


def response_format(fmt: str | dict | None) -> dict | None:
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise OpenAIError(f'format: must be "json" or a JSON schema object, got {fmt[:40]!r}', 400)


def chat_messages(messages: list[Message]) -> list[dict]:
    """Ollama's messages as OpenAI's: tool call arguments as JSON text, a tool's answer
    named by its tool."""
    converted = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise OpenAIError(f"messages.{i}.role: must be one of {', '.join(ROLES)}, got "
                              f"{m.role[:40]!r}", 400)
        if m.images:
            raise OpenAIError(f"messages.{i}.images: this server runs text models only", 400)
        message = {"role": m.role, "content": m.content or ""}
        if m.tool_calls:
            message["tool_calls"] = [{"type": "function", "function": {
                "name": c.function.name, "arguments": json.dumps(c.function.arguments)}}
                for c in m.tool_calls]
        if m.tool_name is not None:
            message["name"] = m.tool_name
        converted.append(message)
    return converted


def build(model_class, **fields):
    """An OpenAI request model from mapped fields; what it refuses is a 400 naming the field."""
    try:
        return model_class(**fields)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        raise OpenAIError(f"{where}: {first.get('msg', 'invalid value')}", 400,
                          str(first.get("loc", ("",))[0])) from e
