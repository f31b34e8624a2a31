"""GET /tokenizer_info, vLLM's route: what a client needs to tokenize as the server does.

lm-eval's remote tokenizer (`local-completions` with no `tokenizer=`) probes it, reads
`eos_token`, `bos_token`, `pad_token` and `chat_template`, then tokenizes through /tokenize
and /detokenize, so an evaluation needs no copy of the model's tokenizer on the client."""

from __future__ import annotations

from typing import Any

# Paths on the server's disk: no business of a client's.
_PRIVATE_KEYS = {"name_or_path", "vocab_file", "merges_file", "tokenizer_file"}
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")
_SKIP = object()  # a value JSON cannot carry


def _plain(value: Any) -> Any:
    """A JSON-ready copy of an init kwarg (an AddedToken becomes its text), or _SKIP."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "content"):  # tokenizers' AddedToken
        return str(value.content)
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return _SKIP if any(v is _SKIP for v in items) else items
    if isinstance(value, dict):
        items = {str(k): _plain(v) for k, v in value.items()}
        return _SKIP if any(v is _SKIP for v in items.values()) else items
    return _SKIP


def tokenizer_info(tokenizer, chat_template: str | None) -> dict[str, Any]:
    """The tokenizer's class and the init kwargs JSON can carry, the special tokens as text
    (null when the tokenizer has none) and the chat template in force (--chat-template, else
    the tokenizer's; null when there is neither)."""
    info: dict[str, Any] = {"tokenizer_class": type(tokenizer).__name__}
    for key, value in tokenizer.init_kwargs.items():
        plain = _plain(value)
        if key not in _PRIVATE_KEYS and plain is not _SKIP:
            info[key] = plain
    for name in SPECIAL_TOKENS:
        info[name] = getattr(tokenizer, name)
    info["chat_template"] = chat_template or tokenizer.chat_template
    return info
