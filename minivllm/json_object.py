"""The one reading of a flag that takes a JSON object (--override-generation-config,
--speculative-config, --pooler-config): a str is parsed, a dict taken as is, and bad JSON,
a non-object or an unknown key is a ValueError starting with the flag's prefix."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def json_object(value: str | dict, prefix: str, example: str, known: Iterable[str]
                ) -> dict[str, Any]:
    """`prefix`: what each message starts with ("flag: ", or "" where argparse names the
    flag); `example`: a valid object, shown when the value is not one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{prefix}not valid JSON ({e}): {value!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{prefix}must be a JSON object such as '{example}', got {value!r}")
    known = list(known)
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"{prefix}unknown key(s) {', '.join(map(repr, unknown))}; known: "
                         f"{', '.join(known)}")
    return value
