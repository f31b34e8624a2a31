"""The KV cache's bytes per token at a --kv-cache-dtype, as the model runner sizes its blocks
(model/runner.py `_kv_bytes`), without torch: the simulator's cost models size the KV cache,
its decode reads and the disk tier's block files by it."""

from __future__ import annotations

# model/kv_quant.py's FORMATS: one byte per value and an fp32 scale per token and KV head.
QUANTIZED_KV_DTYPES = ("int8", "fp8", "fp8_e4m3", "fp8_e5m2")


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int,
                       kv_cache_dtype: str = "auto") -> int:
    """K and V of one token in every layer. `dtype_bytes`: the model's dtype, which "auto"
    keeps; bfloat16 (bf16) stores 2 bytes a value."""
    values = num_layers * num_kv_heads * head_dim
    if kv_cache_dtype in QUANTIZED_KV_DTYPES:
        return 2 * (values + num_layers * num_kv_heads * 4)
    if kv_cache_dtype in ("bfloat16", "bf16"):
        return 2 * values * 2
    if kv_cache_dtype == "auto":
        return 2 * values * dtype_bytes
    raise ValueError(f"kv_cache_dtype (--kv-cache-dtype) must be auto, bfloat16, bf16 or one "
                     f"of {', '.join(QUANTIZED_KV_DTYPES)}, got {kv_cache_dtype!r}")
