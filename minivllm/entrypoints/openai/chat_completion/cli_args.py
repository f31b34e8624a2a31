"""The server's tool-calling and reasoning flags (vLLM's spellings)."""

from __future__ import annotations

import argparse

from minivllm.entrypoints.openai.chat_completion.reasoning_parsers import REASONING_PARSERS
from minivllm.entrypoints.openai.chat_completion.tool_parsers import TOOL_PARSERS


def add_tool_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--enable-auto-tool-choice", action="store_true",
                        help='let the model decide to call tools (tool_choice "auto"); needs '
                             "--tool-call-parser")
    parser.add_argument("--tool-call-parser", choices=sorted(TOOL_PARSERS), default=None,
                        help="how tool calls are written in the model's text: hermes "
                             "(<tool_call>{...}</tool_call>, Qwen2.5/Qwen3/Hermes) or "
                             "llama3_json")
    parser.add_argument("--reasoning-parser", choices=sorted(REASONING_PARSERS), default=None,
                        help="split <think>...</think> into reasoning_content (qwen3, "
                             "deepseek_r1)")


def parsers_from_args(args) -> tuple[object | None, object | None]:
    """(tool parser for tool_choice auto, reasoning parser), None where not asked for."""
    auto = getattr(args, "enable_auto_tool_choice", False)
    name = getattr(args, "tool_call_parser", None)
    if auto and name is None:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")
    tool_parser = TOOL_PARSERS[name]() if auto else None
    reasoning = getattr(args, "reasoning_parser", None)
    return tool_parser, REASONING_PARSERS[reasoning]() if reasoning else None
