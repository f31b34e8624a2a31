"""llama-server's POST /tokenize form (`content` -> `tokens`), served at the same path as
vLLM's (`prompt` / `messages` -> `count`, `max_model_len`, `tokens`): the route in
openai/tokenization/ answers each request in the form it asked in."""

from __future__ import annotations

from minivllm.entrypoints.llamacpp.pieces import piece
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.serving import OpenAIServing


def tokenize(base: OpenAIServing, content: str, add_special: bool, parse_special: bool,
             with_pieces: bool) -> dict:
    """`add_special`: the BOS (llama-server's default: none); `parse_special`: special
    tokens written in the text are those tokens (else their characters' tokens)."""
    try:
        content.encode()
    except UnicodeEncodeError as e:  # a lone surrogate ("\ud800" in JSON)
        raise OpenAIError(f"content: not valid Unicode ({e.reason})", 400, "content") from e
    tokens = base.tokenizer.encode(content, add_special_tokens=add_special,
                                   split_special_tokens=not parse_special)
    if with_pieces:
        return {"tokens": [{"id": t, "piece": piece(base.tokenizer, t)} for t in tokens]}
    return {"tokens": tokens}
