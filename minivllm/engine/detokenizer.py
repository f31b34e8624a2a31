"""Incremental detokenization and stop strings.

Each new token is decoded together with a few tokens before it, and only the text that
grew is emitted — so sentencepiece's leading spaces and byte-level tokens come out right,
and a multi-byte character split over several tokens is held back until it is whole.
"""

from __future__ import annotations

INCOMPLETE = "\ufffd"  # what a tokenizer decodes a partial UTF-8 sequence to


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool,
                 stop: list[str], include_stop_str_in_output: bool) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = stop
        self.include_stop_str = include_stop_str_in_output
        self.max_stop_len = max((len(s) for s in stop), default=0)
        # A few prompt tokens of context make the first output token decode as it would
        # mid-text (e.g. keep its leading space).
        self.token_ids = list(prompt_token_ids[-6:])
        self.prefix_offset = max(len(self.token_ids) - 5, 0)
        self.read_offset = len(self.token_ids)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add_token(self, token_id: int) -> str:
        """Append one token; return the text it completes (possibly empty)."""
        self.token_ids.append(token_id)
        prefix = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith(INCOMPLETE):
            return ""
        delta = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.text += delta
        return delta

    def find_stop(self, delta_len: int) -> str | None:
        """Look for a stop string in the text the last token completed (a stop string may
        span tokens, so look back by its length). Truncate the text at it; return it."""
        if not self.stop or not delta_len:
            return None
        start = max(0, len(self.text) - delta_len - self.max_stop_len + 1)
        best: tuple[int, str] | None = None
        for stop in self.stop:
            at = self.text.find(stop, start)
            if at != -1 and (best is None or at < best[0]):
                best = (at, stop)
        if best is None:
            return None
        at, stop = best
        self.text = self.text[:at + len(stop)] if self.include_stop_str else self.text[:at]
        return stop


class TokenTexts:
    """Each token's text as it reads mid-text, for logprobs: decoded after an anchor token,
    so a sentencepiece token keeps the leading space that decoding it alone would drop,
    and the tokens of an output join back into its text."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.anchor = tokenizer.encode("a", add_special_tokens=False)[-1:]
        self.anchor_len = len(tokenizer.decode(self.anchor))
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self.cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode(self.anchor + [token_id])[self.anchor_len:]
            self.cache[token_id] = text
        return text
