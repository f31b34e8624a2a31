"""Tool calls parsed out of a model's text, for tool_choice "auto" (--enable-auto-tool-choice
--tool-call-parser NAME), whole or as the text streams in.

hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks, as Qwen2.5, Qwen3
and Hermes templates ask for; the text before the first block is the content.
llama3_json: the whole output is {"name": ..., "parameters": {...}} objects separated by
";" (optionally after <|python_tag|>), as Llama 3.1/3.2's JSON tool format.

Streaming sends content as it comes and each call once it is complete (its name, then its
arguments in one fragment): a partial call is held back, never sent half-parsed.
"""

from __future__ import annotations

import json
import re

from minivllm.entrypoints.openai.protocol_tools import FunctionCall


def _call(obj, arguments_key: str) -> FunctionCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get(arguments_key, obj.get("arguments", {}))
    return FunctionCall(name=obj["name"], arguments=json.dumps(arguments, ensure_ascii=False))


class HermesToolParser:
    start, end = "<tool_call>", "</tool_call>"
    _block = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def content_end(self, text: str, final: bool) -> int:
        """How much of `text` is surely content: up to the first block, less a tail that
        may be the start of one."""
        at = text.find(self.start)
        if at >= 0:
            return at
        if final:
            return len(text)
        for keep in range(min(len(self.start) - 1, len(text)), 0, -1):
            if self.start.startswith(text[-keep:]):
                return len(text) - keep
        return len(text)

    def calls(self, text: str, final: bool) -> list[FunctionCall]:
        """The complete calls in `text` (at the end, an unclosed last block too)."""
        found = []
        for match in self._block.finditer(text):
            closed = match.group(0).rstrip().endswith(self.end)
            if not (closed or final):
                break
            try:
                call = _call(json.loads(match.group(1)), "arguments")
            except json.JSONDecodeError:
                continue
            if call is not None:
                found.append(call)
        return found


class Llama3JsonToolParser:
    tag = "<|python_tag|>"

    def _body(self, text: str) -> str | None:
        """The text after the tag, when the output is (or may become) tool calls."""
        stripped = text.lstrip()
        if stripped.startswith(self.tag):
            return stripped[len(self.tag):]
        if stripped.startswith("{") or self.tag.startswith(stripped):
            return stripped
        return None

    def content_end(self, text: str, final: bool) -> int:
        if self._body(text) is None:
            return len(text)
        return 0 if not final or self.calls(text, True) else len(text)

    def calls(self, text: str, final: bool) -> list[FunctionCall]:
        body = self._body(text)
        if body is None or not final:
            return []
        found, decoder, at = [], json.JSONDecoder(), 0
        while at < len(body):
            try:
                obj, at = decoder.raw_decode(body, at)
            except json.JSONDecodeError:
                return []
            call = _call(obj, "parameters")
            if call is None:
                return []
            found.append(call)
            while at < len(body) and body[at] in "; \n\t":
                at += 1
        return found


TOOL_PARSERS = {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser}


def extract_tool_calls(parser, text: str) -> tuple[str | None, list[FunctionCall]]:
    """(content, calls) of a whole output."""
    calls = parser.calls(text, final=True)
    if not calls:
        return text, []
    content = text[:parser.content_end(text, final=True)].strip()
    return content or None, calls


class ToolCallStream:
    """Content and complete calls out of text deltas: feed() returns what is new."""

    def __init__(self, parser) -> None:
        self.parser, self.text = parser, ""
        self.content_sent, self.calls_sent = 0, 0

    def feed(self, delta: str, final: bool) -> tuple[str, list[FunctionCall]]:
        self.text += delta
        calls = self.parser.calls(self.text, final)
        end = self.parser.content_end(self.text, final)
        if final and not calls:
            end = len(self.text)  # no call after all: what was held back is content
        content = self.text[self.content_sent:max(end, self.content_sent)]
        self.content_sent = max(end, self.content_sent)
        new_calls, self.calls_sent = calls[self.calls_sent:], max(len(calls), self.calls_sent)
        return content, new_calls
