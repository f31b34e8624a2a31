"""Prompts of exact token lengths, made with the server's tokenizer or a local tokenizer.json.

Every prompt is a seeded random sequence drawn from a pool of ordinary token ids (the ids of a
short English text, minus the special ids `tokenize("")` returns). Random sequences share no
prefix, so a prefix cache cannot make one request cheaper than another -- except where a trace
says prompts share blocks (Mooncake's hash_ids): each id becomes one seeded block of tokens.

- `ids` mode (default, exact): the prompt is sent as the list of token ids, which /v1/completions
  accepts; the server adds no BOS to an id prompt, so the model sees exactly N tokens.
- `text` mode (needed for chat, works with any server): the ids are detokenized, the text is
  re-tokenized and the ids trimmed or extended until the text tokenizes to N tokens (BOS
  included, as the server will count it). In chat the count covers the message, not the template.

A prompt file's entries (`custom:PATH`, bench/prompt_file.py) carry their own text, sent as
it is in either mode.

Server shapes (vLLM's): POST /tokenize {"model","prompt"} -> {"tokens","count","max_model_len"},
POST /detokenize {"model","tokens"} -> {"prompt"}. The local tokenizer needs only `tokenizers`.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import numpy as np

from minivllm.bench.workload import Trace

POOL_TEXT = (
    "The quick brown fox jumps over the lazy dog. Once upon a time, there was a little girl "
    "named Lily who loved to play outside in the park with her friends. Every morning she ran "
    "to the big tree, looked at the sky and counted the birds. Scheduling requests fairly is "
    "hard: short jobs wait behind long ones, and a busy server must decide who goes first. "
    "def main():\n    for i in range(10):\n        print(i * 2, 'hello world')\n"
)


class ServerTokenizer:
    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str) -> None:
        self.session, self.base_url, self.model = session, base_url.rstrip("/"), model
        self.max_model_len: int | None = None

    async def _post(self, path: str, body: dict) -> dict:
        async with self.session.post(f"{self.base_url}{path}", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"POST {path}: HTTP {r.status}: {(await r.text())[:300]}")
            return await r.json()

    async def encode(self, text: str) -> list[int]:
        data = await self._post("/tokenize", {"model": self.model, "prompt": text})
        self.max_model_len = data.get("max_model_len") or self.max_model_len
        return list(data["tokens"])

    async def decode(self, ids: list[int]) -> str:
        return (await self._post("/detokenize", {"model": self.model, "tokens": ids}))["prompt"]


class LocalTokenizer:
    """A Hugging Face tokenizer.json (or a directory holding one), via the `tokenizers` package."""

    max_model_len = None

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        file = Path(path) / "tokenizer.json" if Path(path).is_dir() else Path(path)
        self.tok = Tokenizer.from_file(str(file))

    async def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=True).ids

    async def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)


async def token_pool(tokenizer, probe: int = 512) -> np.ndarray:
    """Ordinary token ids to build prompts from: those of an English text, or, for a
    tokenizer that knows no English (a word-level vocabulary of a benchmark model), the ids
    among the first `probe` that survive a decode / encode round trip."""
    special = set(await tokenizer.encode(""))
    pool = sorted(set(await tokenizer.encode(POOL_TEXT)) - special)
    if len(pool) < 8:
        pool = []
        for i in range(probe):
            ids = [t for t in await tokenizer.encode(await tokenizer.decode([i]))
                   if t not in special]
            if ids == [i]:
                pool.append(i)
    if len(pool) < 8:
        raise RuntimeError(f"tokenizer gave only {len(pool)} ordinary ids for the pool text "
                           f"and the first {probe} ids")
    return np.asarray(pool)


async def exact_text(tokenizer, ids: list[int], n: int, rng: np.random.Generator,
                     pool: np.ndarray, tries: int = 8) -> tuple[str, int]:
    """Text that tokenizes to n tokens (or the closest found); returns (text, token count)."""
    best: tuple[int, str, int] | None = None
    for _ in range(tries):
        text = await tokenizer.decode(ids)
        count = len(await tokenizer.encode(text))
        if best is None or abs(count - n) < best[0]:
            best = (abs(count - n), text, count)
        if count == n:
            break
        if count > n:
            ids = ids[: max(1, len(ids) - (count - n))]
        else:
            ids = ids + rng.choice(pool, size=n - count).tolist()
    return best[1], best[2]


def prefix_blocks(entry, block_tokens: int, pool: np.ndarray, seed: int,
                  cache: dict[int, list[int]]) -> list[int]:
    """The prompt's shared prefix (Mooncake hash_ids): each id is one seeded block of
    `block_tokens` pool ids, the same wherever it appears; cut to the prompt's length."""
    ids: list[int] = []
    for h in entry.hash_ids:
        if h not in cache:
            cache[h] = np.random.default_rng([seed, h, 1]).choice(pool, size=block_tokens).tolist()
        ids += cache[h]
    return ids[:entry.prompt_tokens]


async def build_prompts(trace: Trace, tokenizer, mode: str = "ids",
                        seed: int = 0) -> tuple[list[list[int] | str], list[int]]:
    """One prompt per trace entry, and each prompt's real token count."""
    if mode not in ("ids", "text"):
        raise ValueError(f"prompt mode must be ids or text, got {mode!r}")
    if all(e.prompt_text is not None for e in trace.entries):  # a prompt file (custom:PATH)
        return [e.prompt_text for e in trace.entries], [e.prompt_tokens for e in trace.entries]
    pool = await token_pool(tokenizer)
    prompts: list[list[int] | str] = []
    counts: list[int] = []
    blocks: dict[int, list[int]] = {}
    for i, entry in enumerate(trace.entries):
        rng = np.random.default_rng([seed, i])
        ids = prefix_blocks(entry, trace.prefix_block_tokens, pool, seed, blocks)
        ids += rng.choice(pool, size=entry.prompt_tokens - len(ids)).tolist()
        if mode == "ids":
            prompts.append(ids)
            counts.append(len(ids))
        else:
            text, count = await exact_text(tokenizer, ids, entry.prompt_tokens, rng, pool)
            prompts.append(text)
            counts.append(count)
    return prompts, counts
