"""JSON Lines files of objects (Mooncake traces, vLLM's custom prompt datasets): each
non-blank line one JSON object, a bad line an error naming the file and the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


def line_error(path: Path, line: int, why: str) -> ValueError:
    return ValueError(f"{path}, line {line}: {why}")


def read_objects(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of the file."""
    with open(path) as f:
        for line, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise line_error(path, line, f"not a JSON object: {e}") from None
            if not isinstance(obj, dict):
                raise line_error(path, line, f"expected a JSON object, got {type(obj).__name__}")
            yield line, obj
