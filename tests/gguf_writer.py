"""A tiny Hugging Face model directory written as a GGUF file the way llama.cpp's
convert_hf_to_gguf writes its architecture: the tensors under that architecture's GGUF
names (the `gguf` package's map), Llama's q/k rows permuted, Gemma's norms stored as
1 + weight, Phi-3's longrope factors as tensors, a tied LM head left out, and the metadata
llama.cpp reads (head size, rotary dimensions, sliding window, soft-caps, RoPE scaling).
Mistral is written as llama.cpp writes it: a "llama" file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "phi3": "phi3", "gemma2": "gemma2"}
_GEMMA = {"gemma2"}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q_proj / k_proj rows (the loader
    undoes it)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _add_metadata(writer: GGUFWriter, cfg, arch: str) -> None:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    writer.add_name(f"tiny {cfg.model_type}")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    if getattr(cfg, "sliding_window", None):
        writer.add_sliding_window(cfg.sliding_window)
    if arch in _GEMMA:
        writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if rope.get("rope_type") == "longrope":
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])


def _add_tokenizer(writer: GGUFWriter, cfg, model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    vocab = sorted(tok.get_vocab().items(), key=lambda item: item[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([3 if i < 3 else 1 for i in range(len(vocab))])  # 3: control
    writer.add_token_scores([0.0] * len(vocab))  # no merges: whole words only
    writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_id)
    writer.add_unk_token_id(tok.unk_token_id)
    if getattr(cfg, "pad_token_id", None) is not None:
        writer.add_pad_token_id(cfg.pad_token_id)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_gguf(model_dir: Path, path: Path,
               qtype_of: Callable[[str], GGMLQuantizationType | None] = lambda name: None
               ) -> dict[str, np.ndarray]:
    """The GGUF file of a tiny model directory, each checkpoint tensor stored as
    qtype_of(its checkpoint name) (None: float32). Returns what each checkpoint tensor
    should load back as (dequantized)."""
    cfg = AutoConfig.from_pretrained(model_dir)
    arch = GGUF_ARCH[cfg.model_type]
    state = {k: v.numpy() for k, v in load_file(model_dir / "model.safetensors").items()}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    writer = GGUFWriter(path, arch)
    _add_metadata(writer, cfg, arch)
    _add_tokenizer(writer, cfg, model_dir)
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type") == "longrope":  # llama.cpp keeps Phi-3's factors as tensors
        for which in ("long", "short"):
            writer.add_tensor(f"rope_factors_{which}.weight",
                              np.array(rope[f"{which}_factor"], np.float32))
    expected = {}
    for name, w in state.items():
        stored = w
        heads = {"q_proj": cfg.num_attention_heads,
                 "k_proj": cfg.num_key_value_heads}.get(name.split(".")[-2])
        if arch == "llama" and heads:
            stored = permute(w, heads)
        elif arch in _GEMMA and name.endswith("norm.weight"):
            stored = w + 1
        if arch in _GEMMA and name == "lm_head.weight":
            raise ValueError("llama.cpp's Gemma 2 ties its LM head to the embeddings: the "
                             "converter writes no output.weight (tie the model's)")
        base, suffix = name.rsplit(".", 1)
        gguf_name = f"{'output' if base == 'lm_head' else names.get_name(base)}.{suffix}"
        expected[name] = w
        qtype = qtype_of(name)
        if qtype is None:
            writer.add_tensor(gguf_name, stored)
            continue
        blocks = gguf.quants.quantize(stored, qtype)
        writer.add_tensor(gguf_name, blocks, raw_dtype=qtype)
        restored = gguf.quants.dequantize(blocks, qtype)
        if arch == "llama" and heads:
            restored = unpermute(restored, heads)
        elif arch in _GEMMA and name.endswith("norm.weight"):
            restored = restored - 1
        expected[name] = restored
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected
