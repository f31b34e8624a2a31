"""run_llamacpp.py's conversion of a Hugging Face Llama model (the random-weight ones of
minivllm/bench/models.py, SmolLM2's fp32 directory) to a GGUF file that llama.cpp loads, with
the public writer API of the `gguf` package (GGUFWriter), cached beside the model directory.

Runs in the peers/llamacpp venv (gguf, numpy, safetensors; no torch). Input: a Hugging Face
LlamaForCausalLM directory (config.json, model.safetensors in fp32, tokenizer.json with a
word-level vocabulary "<unk>", "<s>", "</s>", "w3", ...). Output: `<model dir>-<dtype>.gguf`
next to the model directory (rewritten when the safetensors file is newer).

What the conversion does:
- metadata for llama.cpp's `llama` architecture (context / embedding / feed-forward length,
  block count, head counts, rope dimension and base, RMS-norm epsilon, file type);
- tensors renamed to llama.cpp's names (token_embd, blk.N.attn_q, ..., output_norm). The
  embeddings are tied, so no `output.weight` is written: llama.cpp then uses token_embd as
  the output projection;
- q_proj / k_proj rows permuted into llama.cpp's rotary layout. HF's Llama rotates the two
  halves of each head against each other (dimension i pairs with i + head_dim/2), while
  llama.cpp's llama rope ("normal" mode) rotates adjacent pairs (2i, 2i+1). Reordering each
  head's output rows from [x_0..x_{d/2-1}, y_0..y_{d/2-1}] to [x_0, y_0, x_1, y_1, ...]
  makes llama.cpp's rotation of the pairs the same map as HF's; since q and k are permuted
  identically, q.k (the attention scores) is unchanged, and v / o are left alone;
- a minimal SentencePiece-typed ("llama") vocabulary: the tokenizer.json words with score
  0, <unk> / <s> / </s> marked unknown / control, bos 1, eos 2, unk 0. Benchmarks feed token
  ids, so the vocabulary only has to exist and have the model's size;
- f32 (default): every tensor as is. bf16 / q8_0: the 2-D matrices in bf16 or in llama.cpp's
  q8_0 (blocks of 32 int8 with one f16 scale, quantized by the gguf package), norms in f32.

Verification (llama.cpp's greedy tokens equal transformers' on the same ids) lives in
`run_llamacpp.py --check`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

DTYPES = {"f32": gguf.LlamaFileType.ALL_F32, "bf16": gguf.LlamaFileType.MOSTLY_BF16,
          "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}
# The 2-D matrices' storage type per file type (norms stay f32 in every one).
MATRIX_TYPES = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0,
                "q4_0": gguf.GGMLQuantizationType.Q4_0}

LAYER_NAMES = {  # HF name inside model.layers.N. -> llama.cpp name inside blk.N.
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_path(model_dir: Path, dtype: str = "f32") -> Path:
    """Where the converted file of `model_dir` is cached: beside the directory."""
    model_dir = Path(model_dir).resolve()
    return model_dir.parent / f"{model_dir.name}-{dtype}.gguf"


def rope_to_interleaved(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a q/k projection from HF's half-split rotary layout to llama.cpp's adjacent
    pairs: within each head, row order [0, d/2, 1, d/2+1, ..., d/2-1, d-1]."""
    out_dim = weight.shape[0]
    head_dim = out_dim // n_head
    w = weight.reshape(n_head, 2, head_dim // 2, *weight.shape[1:])
    return np.ascontiguousarray(w.swapaxes(1, 2).reshape(weight.shape))


def _vocab(model_dir: Path, vocab_size: int) -> tuple[list[str], list[int]]:
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    by_id: dict[int, str] = {i: t for t, i in tok["model"]["vocab"].items()}
    for added in tok.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
    special = {"<unk>": gguf.TokenType.UNKNOWN, "<s>": gguf.TokenType.CONTROL,
               "</s>": gguf.TokenType.CONTROL}
    tokens, types = [], []
    for i in range(vocab_size):
        text = by_id.get(i)
        if text is None:  # a hole in the vocabulary: a placeholder nobody produces
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(text)
            types.append(special.get(text, gguf.TokenType.NORMAL))
    return tokens, [int(t) for t in types]


def convert(model_dir: Path, out: Path, dtype: str = "f32") -> Path:
    """Write `out` (GGUF, llama architecture) from the HF Llama model in `model_dir`."""
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        raise ValueError(f"only Llama models are supported, not {cfg.get('model_type')!r}")
    n_head, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads",
                                                         cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    rope_theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get(
        "rope_theta", 10000.0)
    rope_type = (cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}).get(
        "rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"rope scaling {rope_type!r} is not converted")
    weights = load_file(str(model_dir / "model.safetensors"))
    n_layer = cfg["num_hidden_layers"]

    out = Path(out)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(model_dir.name)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope_theta))
    writer.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_file_type(DTYPES[dtype])

    tokens, types = _vocab(model_dir, cfg["vocab_size"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_bos_token_id(cfg.get("bos_token_id", 1))
    writer.add_eos_token_id(cfg.get("eos_token_id", 2))
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)

    def add(name: str, w: np.ndarray) -> None:
        w = np.ascontiguousarray(w, dtype=np.float32)
        if dtype in MATRIX_TYPES and w.ndim == 2:
            raw = MATRIX_TYPES[dtype]
            writer.add_tensor(name, gguf.quants.quantize(w, raw), raw_dtype=raw)
        else:
            writer.add_tensor(name, w)

    add("token_embd.weight", weights.pop("model.embed_tokens.weight"))
    for i in range(n_layer):
        for hf, ours in LAYER_NAMES.items():
            w = weights.pop(f"model.layers.{i}.{hf}")
            if hf == "self_attn.q_proj.weight":
                w = rope_to_interleaved(w, n_head)
            elif hf == "self_attn.k_proj.weight":
                w = rope_to_interleaved(w, n_kv)
            add(f"blk.{i}.{ours}", w)
    add("output_norm.weight", weights.pop("model.norm.weight"))
    lm_head = weights.pop("lm_head.weight", None)
    if lm_head is not None and not cfg.get("tie_word_embeddings", False):
        add("output.weight", lm_head)
    if weights:
        raise ValueError(f"unconverted tensors: {sorted(weights)[:5]} ...")

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def ensure_gguf(model_dir: Path, dtype: str = "f32") -> Path:
    """The cached GGUF of `model_dir`, converted first if missing or older than the weights."""
    model_dir = Path(model_dir)
    out = gguf_path(model_dir, dtype)
    src = model_dir / "model.safetensors"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        convert(model_dir, out, dtype)
    return out
