"""Tool-call and reasoning parsers, whole and fed one character at a time: the stream carries
exactly what the whole parse finds."""

from __future__ import annotations

import json

import pytest

from minivllm.entrypoints.openai.chat_completion.choice_parser import ChoiceParser
from minivllm.entrypoints.openai.chat_completion.reasoning_parsers import REASONING_PARSERS
from minivllm.entrypoints.openai.chat_completion.tool_parsers import TOOL_PARSERS

HERMES = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
          '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {"zone": "a<b"}}'
          '</tool_call>')
LLAMA3 = ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
          '{"name": "get_time", "parameters": {}}')
REQUIRED = ('[{"name": "get_weather", "parameters": {"city": "Pa}r\\"is", "n": [1, {"a": 2}]}}, '
            '{"name": "get_time", "parameters": {}}]')


def fed(parser: ChoiceParser, text: str):
    """(content, reasoning, {index: (name, arguments)}) streamed one character a time."""
    content, reasoning, calls = "", "", {}
    for i, ch in enumerate(text):
        c, r, deltas = parser.feed(ch, i == len(text) - 1)
        content, reasoning = content + c, reasoning + r
        for d in deltas:
            if d.id is not None:
                assert d.index == len(calls) and d.function.name
                calls[d.index] = (d.function.name, "")
            name, args = calls[d.index]
            calls[d.index] = (name, args + (d.function.arguments or ""))
    return content, reasoning, calls


@pytest.mark.parametrize("name, text, content", [
    ("hermes", HERMES, "Let me check."), ("llama3_json", LLAMA3, None)])
def test_auto_parsers_whole_and_streamed(name, text, content):
    parser = TOOL_PARSERS[name]()
    whole_content, _, whole_calls = ChoiceParser("auto", tool_parser=parser).whole(text)
    assert whole_content == content
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in whole_calls]
    assert calls[0] == ("get_weather", {"city": "Paris"}) and calls[1][0] == "get_time"
    streamed_content, _, streamed = fed(ChoiceParser("auto", tool_parser=parser), text)
    assert streamed_content.strip() == (content or "")
    assert [(n, json.loads(a)) for n, a in streamed.values()] == calls


@pytest.mark.parametrize("name", ["hermes", "llama3_json"])
def test_text_without_calls_is_content(name):
    text = "No tools needed <tool or {braces"
    parser = ChoiceParser("auto", tool_parser=TOOL_PARSERS[name]())
    assert parser.whole(text)[0] == text and parser.whole(text)[2] == []
    assert fed(ChoiceParser("auto", tool_parser=TOOL_PARSERS[name]()), text) == (text, "", {})


def test_required_and_named_stream_their_arguments():
    parser = ChoiceParser("required")
    calls = [(c.function.name, c.function.arguments) for c in parser.whole(REQUIRED)[2]]
    assert json.loads(calls[0][1]) == {"city": 'Pa}r"is', "n": [1, {"a": 2}]}
    assert fed(ChoiceParser("required"), REQUIRED)[2] == dict(enumerate(calls))
    args = '{"zone": "UTC"}'
    assert fed(ChoiceParser("named", "get_time"), args)[2] == {0: ("get_time", args)}


@pytest.mark.parametrize("name, text, reasoning, content", [
    ("qwen3", "<think>Hmm, 2 < 3.</think>\n\nYes.", "Hmm, 2 < 3.", "\n\nYes."),
    ("qwen3", "Yes, no thinking.", None, "Yes, no thinking."),
    ("deepseek_r1", "Hmm.</think>Yes.", "Hmm.", "Yes."),
    ("deepseek_r1", "<think>Hmm.</think>Yes.", "Hmm.", "Yes."),
])
def test_reasoning_parsers_whole_and_streamed(name, text, reasoning, content):
    parser = REASONING_PARSERS[name]()
    got_content, got_reasoning, _ = ChoiceParser("none", reasoning_parser=parser).whole(text)
    assert (got_reasoning, got_content) == (reasoning, content)
    streamed = fed(ChoiceParser("none", reasoning_parser=parser), text)
    assert streamed[:2] == (content, reasoning or "")
