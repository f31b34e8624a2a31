"""A token's bytes, as llama-server reports a piece (/tokenize with_pieces, the `bytes` of
n_probs): text when they are valid UTF-8, else the byte values, since a byte-level BPE
token may hold part of a character."""

from __future__ import annotations

import functools
import re

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character each byte is written as."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and type(backend.decoder).__name__ == "ByteLevel"


def token_bytes(tokenizer, token_id: int) -> bytes:
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if piece is not None:
        if match := _BYTE_TOKEN.fullmatch(piece):
            return bytes([int(match.group(1), 16)])
        table = _byte_decoder()
        if _byte_level(tokenizer):
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        elif "\u2581" in piece:  # SentencePiece writes a space as U+2581
            return piece.replace("\u2581", " ").encode()
    return tokenizer.decode([token_id]).encode()


def piece(tokenizer, token_id: int) -> str | list[int]:
    data = token_bytes(tokenizer, token_id)
    try:
        return data.decode()
    except UnicodeDecodeError:
        return list(data)
