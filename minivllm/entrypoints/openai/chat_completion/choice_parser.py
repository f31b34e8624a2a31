"""One chat choice's text turned into what the response carries: content, reasoning_content
and tool_calls, by the request's tool mode — whole (ChoiceParser.whole) or as deltas of a
stream (ChoiceParser.feed, shaped as OpenAI streams tool calls: a call's index, id and name
first, then fragments of its arguments).

Modes: "named" (tool_choice names a function: the grammar makes the whole output its
arguments), "required" (the grammar makes it vLLM's [{"name", "parameters"}, ...] array, written
compact with keys in that order), "auto" (a --tool-call-parser reads calls out of free text),
"none" (text only).
"""

from __future__ import annotations

import json
import re

from minivllm.entrypoints.openai.chat_completion.reasoning_parsers import (
    ReasoningParser,
    ReasoningStream,
)
from minivllm.entrypoints.openai.chat_completion.tool_parsers import (
    ToolCallStream,
    extract_tool_calls,
)
from minivllm.entrypoints.openai.protocol_tools import (
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
    tool_call_id,
)

_REQUIRED_CALL = re.compile(r'\{"name": ("(?:[^"\\]|\\.)*"), "parameters": ')


def _value_end(text: str, start: int) -> int | None:
    """Where the JSON object or array starting at text[start] ends; None while it is open."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _required_calls(text: str) -> list[tuple[str, str, bool]]:
    """(name, arguments so far, complete) of each call begun in a "required" output."""
    calls, at = [], 0
    while (match := _REQUIRED_CALL.search(text, at)) is not None:
        start = match.end()
        end = _value_end(text, start)
        calls.append((json.loads(match.group(1)), text[start:end], end is not None))
        if end is None:
            break
        at = end
    return calls


class ChoiceParser:
    def __init__(self, mode: str, named: str | None = None, tool_parser=None,
                 reasoning_parser: ReasoningParser | None = None) -> None:
        self.mode, self.named, self.tool_parser = mode, named, tool_parser
        # A forced call is JSON from the first token: nothing to think in.
        self.reasoning_parser = reasoning_parser if mode in ("auto", "none") else None
        # streaming state
        self.reasoning = ReasoningStream(reasoning_parser) if self.reasoning_parser else None
        self.tools = ToolCallStream(tool_parser) if mode == "auto" else None
        self.text = ""
        self.ids: list[str] = []  # ids of the calls begun
        self.arguments_sent: list[int] = []

    def whole(self, text: str) -> tuple[str | None, str | None, list[ToolCall]]:
        """(content, reasoning_content, tool_calls) of a finished output."""
        reasoning = None
        if self.reasoning_parser is not None:
            reasoning, text, _ = self.reasoning_parser.split(text)
        if self.mode == "named":
            return None, None, [ToolCall(function=FunctionCall(name=self.named,
                                                               arguments=text))]
        if self.mode == "required":
            calls = [ToolCall(function=FunctionCall(name=name, arguments=args))
                     for name, args, complete in _required_calls(text) if complete]
            return (None if calls else text), None, calls
        if self.mode == "auto":
            content, calls = extract_tool_calls(self.tool_parser, text)
            return content, reasoning, [ToolCall(function=c) for c in calls]
        return text, reasoning, []

    def feed(self, delta: str, final: bool) -> tuple[str, str, list[DeltaToolCall]]:
        """(content, reasoning_content, tool call deltas) new with this text delta."""
        reasoning = ""
        if self.reasoning is not None:
            reasoning, delta = self.reasoning.feed(delta, final)
        if self.mode == "auto":
            content, calls = self.tools.feed(delta, final)
            deltas = []
            for call in calls:
                deltas.append(DeltaToolCall(
                    index=len(self.ids), id=tool_call_id(), type="function",
                    function=DeltaFunctionCall(name=call.name, arguments=call.arguments)))
                self.ids.append(deltas[-1].id)
            return content, reasoning, deltas
        if self.mode == "none":
            return delta, reasoning, []
        self.text += delta
        begun = ([(self.named, self.text, final)] if self.mode == "named"
                 else _required_calls(self.text))
        deltas = []
        for index, (name, arguments, _) in enumerate(begun):
            if index == len(self.ids):  # a new call: its id and name first
                self.ids.append(tool_call_id())
                self.arguments_sent.append(0)
                deltas.append(DeltaToolCall(index=index, id=self.ids[index], type="function",
                                            function=DeltaFunctionCall(name=name,
                                                                       arguments="")))
            fragment = arguments[self.arguments_sent[index]:]
            if fragment:
                self.arguments_sent[index] = len(arguments)
                deltas.append(DeltaToolCall(index=index,
                                            function=DeltaFunctionCall(arguments=fragment)))
        return "", "", deltas

    @property
    def called(self) -> bool:
        return bool(self.ids)
