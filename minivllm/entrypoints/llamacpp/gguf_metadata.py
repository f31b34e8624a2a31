"""A GGUF file's scalar metadata, read without parsing the rest: the FIM token ids of
fim.py are a few integers behind the vocabulary and merges (300k strings for Qwen2.5),
which gguf's GGUFReader parses in full (seconds); here the arrays are skipped over."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

# GGUF value types: fixed sizes (struct codes), 8 is a string, 9 an array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_STRING, _ARRAY = 8, 9


def read_scalars(path: Path, keys: set[str]) -> dict[str, int | float | bool | str]:
    """The values of those of `keys` that the file holds as scalars or strings; ValueError
    if it is not a GGUF file."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        (version,) = struct.unpack_from("<I", data, 4)
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        (num_kv,) = struct.unpack_from("<Q", data, 16)
        offset, found = 24, {}
        for _ in range(num_kv):
            key, offset = _string(data, offset)
            (kind,) = struct.unpack_from("<I", data, offset)
            offset += 4
            if key in keys and kind != _ARRAY:
                found[key], offset = _value(data, offset, kind)
                if len(found) == len(keys):
                    break
            else:
                offset = _skip(data, offset, kind)
        return found


def _string(data, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", data, offset)
    start = offset + 8
    return data[start:start + length].decode("utf-8", "replace"), start + length


def _value(data, offset: int, kind: int):
    if kind == _STRING:
        return _string(data, offset)
    code = "<" + _SCALARS[kind]
    return struct.unpack_from(code, data, offset)[0], offset + struct.calcsize(code)


def _skip(data, offset: int, kind: int) -> int:
    if kind == _STRING:
        return offset + 8 + struct.unpack_from("<Q", data, offset)[0]
    if kind in _SCALARS:
        return offset + struct.calcsize("<" + _SCALARS[kind])
    if kind != _ARRAY:
        raise ValueError(f"unknown GGUF value type {kind}")
    item_kind, count = struct.unpack_from("<IQ", data, offset)
    offset += 12
    if item_kind in _SCALARS:
        return offset + count * struct.calcsize("<" + _SCALARS[item_kind])
    for _ in range(count):  # strings (the vocabulary, merges) or nested arrays
        offset = _skip(data, offset, item_kind)
    return offset
