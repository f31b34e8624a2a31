"""The end of a JSON number: a small model at temperature 0 may never write it.

Why: after a digit, any JSON number may go on with another digit, so no grammar that accepts
every valid number can end one. SmolLM2-135M-Instruct asked for `{"population_millions":
float}` puts ~85% of its mass on the next digit after every digit and under 3% on `}`, so
greedy decoding writes "31212222312344444..." until max_tokens.

What: in a JSON output (`json` schemas and `json_object`; tool calls are `json`), once the
number being written has MAX_NUMBER_DIGITS digits, the tokens that would extend it (those
starting with a digit, ".", "e", "E", "+" or "-") are masked, as long as the grammar allows
some other token (a "," or a "}"); where it allows only those, nothing changes. The grammar
itself is untouched: it accepts what it did, and the output is always valid for it.
20 digits lose nothing a JSON reader keeps: every int64 and uint64 has at most 20, and
every float64 in its shortest form (Python's repr, JavaScript's toString) at most 17 in
the mantissa and 3 in the exponent. Strings are not numbers: digits inside quotes never count.

Pure Python over each token's bytes, fed one sampled token at a time (model/sampler.py).
"""

from __future__ import annotations

import numpy as np

MAX_NUMBER_DIGITS = 20
JSON_KINDS = ("json", "json_object")
_DIGITS = frozenset(b"0123456789")
_NUMBER_BYTES = frozenset(b"0123456789.eE+-")


class NumberGuardTables:
    """Per vocabulary: each token's bytes, and which tokens start with a byte that continues a
    number (built once per tokenizer, with the grammar compiler's tokenizer)."""

    def __init__(self, token_bytes: list[bytes]) -> None:
        """token_bytes: one per column of the logits (b"" past the tokenizer's vocabulary)."""
        self.token_bytes = token_bytes
        self.extends_number = np.array(
            [bool(b) and b[0] in _NUMBER_BYTES for b in token_bytes], dtype=bool)


class JsonNumberGuard:
    """One request's JSON lexical state: inside a string or not, and the digits of the number
    being written."""

    def __init__(self, tables: NumberGuardTables) -> None:
        self.tables = tables
        self.in_string = self.escaped = False
        self.digits = 0

    def consume(self, token: int) -> None:
        for byte in self.tables.token_bytes[token]:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif byte == 0x5C:  # backslash
                    self.escaped = True
                elif byte == 0x22:  # closing quote
                    self.in_string = False
            elif byte == 0x22:
                self.in_string, self.digits = True, 0
            elif byte in _DIGITS:
                self.digits += 1
            elif byte not in _NUMBER_BYTES:
                self.digits = 0

    def restrict(self, allowed: np.ndarray) -> None:
        """Masks, in place, the tokens that would extend a number already MAX_NUMBER_DIGITS
        long, unless nothing else is allowed."""
        if self.in_string or self.digits < MAX_NUMBER_DIGITS:
            return
        ending = allowed & ~self.tables.extends_number
        if ending.any():
            allowed[:] = ending
