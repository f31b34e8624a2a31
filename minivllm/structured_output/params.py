"""StructuredOutputsParams: what a request's output must match, spelled as vLLM's.

Exactly one of the constraints is set. Plain data (it crosses to the engine core with the
SamplingParams); the grammar itself is built from it by grammar.py.
"""

from __future__ import annotations

import json as json_module
from dataclasses import dataclass
from typing import Any

CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None  # a JSON schema (text or object)
    regex: str | None = None
    choice: list[str] | None = None  # the output is one of these strings
    grammar: str | None = None  # EBNF (GBNF) or Lark
    json_object: bool | None = None  # any JSON object
    structural_tag: str | None = None  # vLLM's {"type": "structural_tag", ...} as text

    def __post_init__(self) -> None:
        given = [name for name in CONSTRAINTS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured_outputs must set exactly one of "
                             f"{', '.join(CONSTRAINTS)}; got {given or 'none'}")
        if self.choice is not None and (not self.choice or not all(
                isinstance(c, str) for c in self.choice)):
            raise ValueError("choice must be a non-empty list of strings")

    @property
    def kind(self) -> str:
        return next(name for name in CONSTRAINTS if getattr(self, name) not in (None, False))

    def key(self) -> str:
        """Equal for equal constraints: the compiled-grammar cache's key."""
        value = getattr(self, self.kind)
        if isinstance(value, dict | list):
            value = json_module.dumps(value, sort_keys=True)
        return f"{self.kind}:{value}"
