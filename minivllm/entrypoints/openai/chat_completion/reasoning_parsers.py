"""The thinking of <think>…</think> models (--reasoning-parser), split from the answer into
message.reasoning_content, whole or as the text streams in.

deepseek_r1: the output is thinking until </think> (DeepSeek-R1's template opens <think> in
the prompt; a <think> the model writes itself is dropped). qwen3: thinking only when the
output opens with <think> (Qwen3 writes it itself, and skips it with thinking off).
"""

from __future__ import annotations

START, END = "<think>", "</think>"


def _held_back(text: str, tag: str) -> int:
    """How many trailing characters of `text` may be the start of `tag`."""
    for keep in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-keep:]):
            return keep
    return 0


class ReasoningParser:
    def __init__(self, starts_thinking: bool) -> None:
        self.starts_thinking = starts_thinking  # deepseek_r1: thinking without a <think>

    def split(self, text: str, final: bool = True) -> tuple[str | None, str, int]:
        """(reasoning, content, how much of text is decided): reasoning None when the
        output does not think. While streaming (not final) a tail that may be the start of
        a tag is left undecided."""
        stripped = text.lstrip()
        if not final and len(stripped) < len(START) and START.startswith(stripped):
            return None, "", 0  # it may still open with <think>
        opened = stripped.startswith(START)
        if not (opened or self.starts_thinking):
            return None, text, len(text)
        body_start = len(text) - len(stripped) + (len(START) if opened else 0)
        end = text.find(END, body_start)
        if end < 0:
            keep = 0 if final else _held_back(text, END)
            return text[body_start:len(text) - keep], "", len(text) - keep
        return text[body_start:end], text[end + len(END):], len(text)


REASONING_PARSERS = {"deepseek_r1": lambda: ReasoningParser(starts_thinking=True),
                     "qwen3": lambda: ReasoningParser(starts_thinking=False)}


class ReasoningStream:
    """reasoning and content deltas out of text deltas."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser, self.text = parser, ""
        self.reasoning_sent, self.content_sent = 0, 0

    def feed(self, delta: str, final: bool) -> tuple[str, str]:
        self.text += delta
        reasoning, content, _ = self.parser.split(self.text, final)
        reasoning = reasoning or ""
        new_reasoning = reasoning[self.reasoning_sent:]
        new_content = content[self.content_sent:]
        self.reasoning_sent, self.content_sent = len(reasoning), len(content)
        return new_reasoning, new_content
