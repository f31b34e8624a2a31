"""What a GGUF file's metadata says of the model that transformers' GGUF reader leaves out
of the config, put back as llama.cpp reads it:
- the head size (`{arch}.attention.key_length`): Qwen3-0.6B's heads are 128 wide, not
  1024 / 16; transformers keeps Qwen3Config's default, right for Qwen3 by chance only;
- Phi-3's rotary dimensions (`rope.dimension_count`, Phi-4-mini's 3/4 of a head), its
  sliding window, and its longrope factors, which llama.cpp stores as the tensors
  `rope_factors_long` / `rope_factors_short` (Phi-3.5-mini, Phi-3-mini-128k);
- Gemma 2's attention and final soft-caps, and its query scale: no key holds it; llama.cpp
  scales by 1/sqrt(head size), by 1/sqrt(hidden / heads) for the 27B (46 layers), which is
  what query_pre_attn_scalar says in the checkpoints' configs.
"""

from __future__ import annotations

import numpy as np

# llama.cpp's rule for Gemma 2's query scale: its 27B model (by layer count) scales by
# hidden / heads, the others by the head size.
GEMMA2_27B_LAYERS = 46


def complete_config(config, reader, arch: str) -> None:
    """Set on a transformers config (from the file, by transformers) what the metadata of
    a GGUF file of architecture `arch` holds and transformers did not read."""
    def value(key: str):
        field = reader.fields.get(f"{arch}.{key}")
        return field.contents() if field is not None else None

    if value("attention.key_length"):
        config.head_dim = int(value("attention.key_length"))
    if arch == "phi3":
        _phi3(config, reader, value)
    elif arch == "gemma2":
        config.attn_logit_softcapping = value("attn_logit_softcapping")
        config.final_logit_softcapping = value("final_logit_softcapping")
        config.query_pre_attn_scalar = (
            config.hidden_size // config.num_attention_heads
            if config.num_hidden_layers == GEMMA2_27B_LAYERS else config.head_dim)


def _phi3(config, reader, value) -> None:
    rope = dict(config.rope_parameters or {})
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads)
    rotary = value("rope.dimension_count")
    if rotary and rotary != head_dim:
        rope["partial_rotary_factor"] = rotary / head_dim
    factors = {t.name: np.asarray(t.data, dtype=np.float64).tolist() for t in reader.tensors
               if t.name in ("rope_factors_long.weight", "rope_factors_short.weight")}
    if factors:
        original = int(value("rope.scaling.original_context_length"))
        rope.update(rope_type="longrope", original_max_position_embeddings=original,
                    long_factor=factors["rope_factors_long.weight"],
                    short_factor=factors["rope_factors_short.weight"])
        config.original_max_position_embeddings = original
    config.rope_parameters = rope
    if value("attention.sliding_window"):
        config.sliding_window = int(value("attention.sliding_window"))
