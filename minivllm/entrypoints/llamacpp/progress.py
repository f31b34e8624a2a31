"""One request's answer as its deltas arrive: the text, tokens and logprob steps so far, what
of them was sent, and llama-server's `n_indent` stop (code completion's: a line after the
first that is indented less than n_indent ends the answer before it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.outputs import CompletionOutput


@dataclass
class Progress:
    n_indent: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    steps: list = field(default_factory=list)
    sent_text: int = 0
    sent_tokens: int = 0
    cut: bool = False  # ended early: by n_indent, or by t_max_predict_ms (serving.py)
    _checked: int = 0  # where the next line to check starts (0: none yet)

    def add(self, c: CompletionOutput) -> None:
        if self.cut:
            return
        self.text += c.text
        self.token_ids += c.token_ids
        self.steps += c.logprobs or []
        if self.n_indent > 0:
            self._check_indent()

    def _check_indent(self) -> None:
        """As llama-server checks: the first line is free; a later line whose first
        non-blank character (a newline too) comes after fewer than n_indent spaces or tabs
        is cut off after its indentation."""
        while True:
            if not self._checked:
                newline = self.text.find("\n")
            else:
                pos = self._checked
                while pos < len(self.text) and self.text[pos] in " \t":
                    pos += 1
                if pos == len(self.text):
                    return  # the line's indentation is not complete yet
                if pos - self._checked < self.n_indent:
                    self.text, self.cut = self.text[:pos], True
                    return
                newline = self.text.find("\n", pos)
            if newline < 0:
                return
            self._checked = newline + 1

    def unsent(self) -> tuple[str, list[int], list]:
        """What is new since the last call: text, token ids, logprob steps."""
        text, self.sent_text = self.text[self.sent_text:], len(self.text)
        new = slice(self.sent_tokens, len(self.token_ids))
        self.sent_tokens = len(self.token_ids)
        return text, self.token_ids[new], self.steps[new]
