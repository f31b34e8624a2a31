"""Fill-in-the-middle: the model's own FIM tokens and the infill prompt llama-server builds
from them (for /infill and the `suffix` of /v1/completions).

The tokens come from the GGUF file's metadata when it names them (`tokenizer.ggml.fim_*`,
or the older prefix / suffix / middle keys), else from the vocabulary by the names
llama.cpp recognizes (`<|fim_prefix|>` of Qwen2.5-Coder, `<fim_prefix>` of StarCoder and
Granite, ...). The layout is llama-server's (its format_prompt_infill): with the repo-level
tokens (Qwen2.5-Coder's `<|repo_name|>`, `<|file_sep|>`) the extra chunks are files of a
project before the current one; without, they are prefixed as snippets.

    [REP]myproject\\n [SEP]{filename}\\n{text} ... [SEP]filename\\n
    [PRE]{input_prefix}{prompt}[SUF]{input_suffix}[MID]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from minivllm.entrypoints.llamacpp.gguf_metadata import read_scalars
from minivllm.model.gguf import POINTER

# Each role: its GGUF metadata keys (newest first), then the token names that mean it.
ROLES = {
    "pre": (("fim_pre_token_id", "prefix_token_id"),
            ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
             "▁<PRE>", "<|code_prefix|>", "<|prefix|>")),
    "suf": (("fim_suf_token_id", "suffix_token_id"),
            ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
             "▁<SUF>", "<|code_suffix|>", "<|suffix|>")),
    "mid": (("fim_mid_token_id", "middle_token_id"),
            ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
             "▁<MID>", "<|code_middle|>", "<|middle|>")),
    "pad": (("fim_pad_token_id",), ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>")),
    "rep": (("fim_rep_token_id",), ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                    "<reponame>")),
    "sep": (("fim_sep_token_id",), ("<|file_sep|>",)),
}
REQUIRED = {"pre": "prefix", "suf": "suffix", "mid": "middle"}
# Tokens that end a generation in llama.cpp whatever the model's EOS (its end-of-generation
# set, by name): a FIM model ends a middle with <|endoftext|>, not its chat EOS.
EOG_NAMES = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
             "<|eom_id|>", "<EOT>", "<|end_of_text|>", "<｜end▁of▁sentence｜>")
SNIPPET = "\n\n--- snippet ---\n\n"  # llama-server's chunk separator without file tokens
N_BATCH = 2048  # llama-server's default logical batch, which its FIM context is cut to fit


@dataclass(frozen=True)
class FimTokens:
    pre: int | None = None
    suf: int | None = None
    mid: int | None = None
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None

    def missing(self) -> list[str]:
        return [f"{name} (tokenizer.ggml.fim_{role}_token_id, or a token such as "
                f"{ROLES[role][1][0]})" for role, name in REQUIRED.items()
                if getattr(self, role) is None]

    def check(self, field: str) -> None:
        """ValueError naming the missing tokens when the model cannot fill in."""
        if missing := self.missing():
            raise ValueError(f"{field}: this model has no fill-in-the-middle tokens: missing "
                             f"the FIM {', '.join(missing)}")


def gguf_path(model_dir: Path) -> Path | None:
    """The GGUF file a model directory was built from (model/gguf.py's pointer), if any."""
    pointer = model_dir / POINTER
    return Path(json.loads(pointer.read_text())["gguf_file"]) if pointer.exists() else None


def find_fim_tokens(tokenizer, gguf_file: Path | None) -> FimTokens:
    meta = {}
    if gguf_file is not None:
        keys = {f"tokenizer.ggml.{k}" for keys, _ in ROLES.values() for k in keys}
        meta = read_scalars(gguf_file, keys)
    vocab = _vocab(tokenizer)
    ids = {}
    for role, (keys, names) in ROLES.items():
        from_meta = (meta.get(f"tokenizer.ggml.{k}") for k in keys)
        from_vocab = (vocab.get(name) for name in names)
        ids[role] = next((int(v) for v in (*from_meta, *from_vocab) if v is not None), None)
    return FimTokens(**ids)


def eog_token_ids(tokenizer, fim: FimTokens) -> list[int]:
    """llama.cpp's end-of-generation tokens besides the EOS: the FIM pad / repo / file
    separator and the end-of-turn tokens the vocabulary holds."""
    vocab = _vocab(tokenizer)
    ids = {getattr(fim, role) for role in ("pad", "rep", "sep")}
    ids.update(vocab.get(name) for name in EOG_NAMES)
    ids.discard(None)
    return sorted(ids)


def infill_prompt(tokenizer, fim: FimTokens, prefix: str, suffix: str,
                  extra: list[tuple[str, str]], prompt: str, n_ctx: int, n_predict: int
                  ) -> list[int]:
    """The token ids of llama-server's infill prompt. `extra`: (filename, text) chunks. Its
    cuts: the prefix's last 3/4 of a batch, the suffix's first 1/4 (less the prompt), the
    extra context's last tokens that leave room for the batch and 2 * n_predict."""
    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    extra_ids = [] if fim.rep is None else [fim.rep, *encode("myproject\n")]
    for filename, text in extra:
        extra_ids += [fim.sep, *encode(filename + "\n")] if fim.sep is not None \
            else encode(SNIPPET)
        extra_ids += encode(text)
    if fim.sep is not None:
        extra_ids += [fim.sep, *encode("filename\n")]
    # llama-server's default batch; a context under twice that keeps half of it for the
    # prompt (llama-server would cut to the whole batch, overflow a context that small and
    # keep no extra context, not even the repo-level header)
    n_batch = min(N_BATCH, n_ctx // 2)
    prompt_ids = encode(prompt)
    prefix_ids = encode(prefix)
    prefix_ids = prefix_ids[max(0, len(prefix_ids) - 3 * (n_batch // 4)):]
    suffix_ids = encode(suffix)[:max(0, n_batch // 4 - (2 + len(prompt_ids)))]
    n_extra = min(max(0, n_ctx - n_batch - 2 * max(n_predict, 0)), len(extra_ids))
    bos = _bos(tokenizer)
    return [*extra_ids[len(extra_ids) - n_extra:], *bos, fim.pre, *prefix_ids, *prompt_ids,
            fim.suf, *suffix_ids, fim.mid]


def _vocab(tokenizer) -> dict[str, int]:
    """Token name -> id; empty for a tokenizer that cannot list them (no names to find)."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    return get_vocab() if get_vocab is not None else {}


def _bos(tokenizer) -> list[int]:
    """[BOS] when the tokenizer starts a text with it (llama.cpp's add_bos_token)."""
    bos = tokenizer.bos_token_id
    return [bos] if bos is not None and tokenizer.encode("a")[:1] == [bos] else []

