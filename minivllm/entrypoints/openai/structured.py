"""A request's constraint: from response_format, structured_outputs, guided_* or a tool_choice
that forces a call, to StructuredOutputsParams, checked here so that a bad schema or grammar
is a 400 naming its field, before the engine sees it."""

from __future__ import annotations

from minivllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.protocol import SamplingRequest
from minivllm.structured_output.grammar import GrammarError, check_grammar
from minivllm.structured_output.params import StructuredOutputsParams

GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}


def _params(field: str, **constraint) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**constraint)
    except (ValueError, TypeError) as e:
        raise OpenAIError(f"{field}: {e}", 400, field) from e


def _requested(req: SamplingRequest) -> list[tuple[str, StructuredOutputsParams]]:
    """(field, constraint) for each constraint the request carries."""
    found = []
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        found.append(("response_format", _params("response_format", json_object=True)))
    elif fmt is not None and fmt.type == "json_schema":
        field = "response_format.json_schema.schema"
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise OpenAIError(f"{field}: required when type is json_schema", 400, field)
        found.append((field, _params(field, json=fmt.json_schema.json_schema)))
    if req.structured_outputs is not None:
        given = req.structured_outputs.model_dump(exclude_none=True, by_alias=True)
        found.append(("structured_outputs", _params("structured_outputs", **given)))
    for name, kind in GUIDED_FIELDS.items():
        value = getattr(req, name)
        if value is not None:
            found.append((name, _params(name, **{kind: value})))
    return found


def request_constraint(req: SamplingRequest) -> StructuredOutputsParams | None:
    """The request's constraint, checked; None without one."""
    found = _requested(req)
    if len(found) > 1:
        fields = ", ".join(field for field, _ in found)
        raise OpenAIError(f"at most one constraint per request, got {fields}", 400,
                          found[1][0])
    if not found:
        return None
    field, params = found[0]
    if field == "structured_outputs":
        field = f"structured_outputs.{params.kind}"
    check(params, field)
    return params


def check(params: StructuredOutputsParams, field: str) -> None:
    try:
        check_grammar(params, field)
    except GrammarError as e:
        raise OpenAIError(str(e), 400, e.field) from e


def tool_choice_constraint(req: ChatCompletionRequest) -> StructuredOutputsParams | None:
    """The grammar of a forced tool call. Named: the output is that function's arguments.
    required: a JSON array of {"name", "parameters"} objects, one of the tools each (one
    call at most unless parallel_tool_calls) — vLLM's format."""
    choice, tools = req.tool_choice, req.tools or []
    if choice is None or choice in ("none", "auto"):
        return None
    if not tools:
        raise OpenAIError("tool_choice: requires tools", 400, "tool_choice")
    if choice == "required":
        calls = [{"type": "object", "properties": {
            "name": {"const": t.function.name},
            "parameters": t.function.parameters or {"type": "object"}},
            "required": ["name", "parameters"], "additionalProperties": False}
            for t in tools]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not req.parallel_tool_calls:
            schema["maxItems"] = 1
        params = StructuredOutputsParams(json=schema)
        check(params, "tools")
        return params
    tool = next((t for t in tools if t.function.name == choice.function.name), None)
    if tool is None:
        raise OpenAIError(f"tool_choice: no tool named {choice.function.name!r} in tools",
                          400, "tool_choice")
    params = StructuredOutputsParams(json=tool.function.parameters or {"type": "object"})
    check(params, "tools")
    return params
