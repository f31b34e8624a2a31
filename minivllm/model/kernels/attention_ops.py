"""The attention kernels' torch-facing wrappers: paged decode and prefill attention over
the KV cache read in place (paged_decode_attention.c, paged_prefill_attention.c, and for a
bf16 cache's prefill amx_attention.c, dpbf16_attention.c), and rope_write_kv, which rotates
q and k and writes k and v into that cache (ops.c). fp32 CPU tensors; the caches fp32,
bf16 or quantized (QuantizedKV)."""

from __future__ import annotations

from functools import cache

import torch

from minivllm.model.kernels import library
from minivllm.model.kv_quant import QuantizedKV


@cache
def _fp8_values(dtype: torch.dtype) -> torch.Tensor:
    """The fp32 value of each of the 256 bytes of an fp8 type: the C kernels' lookup table
    (torch's own conversion, so that both read the same values)."""
    return torch.arange(256, dtype=torch.uint8).view(dtype).float()


def _kv_args(k_cache: torch.Tensor | QuantizedKV, v_cache: torch.Tensor | QuantizedKV) -> dict:
    """The kernels' K/V cache arguments (kernels.h): pointers, kv_type and the quantized
    types' scales and fp8 table."""
    if isinstance(k_cache, QuantizedKV):
        fp8 = k_cache.fmt.storage != k_cache.fmt.dtype
        return dict(k_cache=k_cache.data.data_ptr(), v_cache=v_cache.data.data_ptr(),
                    k_scales=k_cache.scales.data_ptr(), v_scales=v_cache.scales.data_ptr(),
                    kv_type=k_cache.fmt.kernel_type,
                    fp8_values=_fp8_values(k_cache.fmt.dtype).data_ptr() if fp8 else None)
    return dict(k_cache=k_cache.data_ptr(), v_cache=v_cache.data_ptr(), k_scales=None,
                v_scales=None, kv_type=int(k_cache.dtype == torch.bfloat16), fp8_values=None)


def _is_bf16(cache: torch.Tensor | QuantizedKV) -> bool:
    return not isinstance(cache, QuantizedKV) and cache.dtype == torch.bfloat16


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, seq_lens: torch.Tensor,
                           scale: float, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """q: [B, H, D] (rows may be strided); caches: [num_blocks, block_size, KVH, D]
    (contiguous, fp32 or bf16, or a QuantizedKV); block_table: [B, max_blocks] and
    seq_lens: [B], int64 -> [B, H, D]."""
    num_seqs, num_heads, head_dim = q.shape
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        q = q.contiguous()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _, block_size, num_kv_heads, _ = k_cache.shape
    library._library().paged_decode_attention_f32(
        q=q.data_ptr(), **_kv_args(k_cache, v_cache), block_table=block_table.data_ptr(),
        seq_lens=seq_lens.data_ptr(), out=out.data_ptr(), num_seqs=num_seqs,
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        block_size=block_size, max_blocks=block_table.shape[1], q_stride=q.stride(0),
        scale=scale, window=window, softcap=softcap, num_threads=torch.get_num_threads())
    return out


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_table: torch.Tensor, query_start_loc: torch.Tensor,
                            seq_lens: torch.Tensor, scale: float, window: int = 0,
                            softcap: float = 0.0, bf16_products: bool = True) -> torch.Tensor:
    """Causal attention of P requests' new tokens over their paged contexts, read in place.

    q: [T, H, D], the new tokens of the P requests concatenated (rows may be strided);
    caches: [num_blocks, block_size, KVH, D] (contiguous, one layer, fp32 or bf16, or a
    QuantizedKV); block_table:
    [P, max_blocks] (padded rows); query_start_loc: [P + 1] from 0 to T; seq_lens: [P],
    each request's context length after this step; all int64. Request p's queries are its
    last query_len positions: query i sits at position seq_lens[p] - query_len + i and
    sees positions 0..that one. H is a multiple of KVH (GQA). Returns [T, H, D].
    A bf16 cache without window and softcap runs on AMX tiles where library.amx()
    (amx_attention.c), else on AVX-512 BF16 pair dots where the library has them
    (dpbf16_attention.c): both round q and the probabilities to bf16 for the products.
    bf16_products=False: the fp32-math kernel whatever the cache (the reference the
    benchmarks and tests hold them to)."""
    _, num_heads, head_dim = q.shape
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        q = q.contiguous()
    block_table, query_start_loc, seq_lens = (
        t.contiguous() for t in (block_table, query_start_loc, seq_lens))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _, block_size, num_kv_heads, _ = k_cache.shape
    if bf16_products and _is_bf16(k_cache) and not window and not softcap:
        args = dict(
            q=q.data_ptr(), k_cache=k_cache.data_ptr(), v_cache=v_cache.data_ptr(),
            block_table=block_table.data_ptr(), query_start_loc=query_start_loc.data_ptr(),
            seq_lens=seq_lens.data_ptr(), out=out.data_ptr(), num_reqs=seq_lens.shape[0],
            num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
            block_size=block_size, max_blocks=block_table.shape[1], q_stride=q.stride(0),
            scale=scale, num_threads=torch.get_num_threads())
        # each returns -1 where it cannot run (no AMX / AVX512-BF16 in the library, head_dim)
        if library.amx() and library._library().paged_prefill_attention_amx(**args) == 0:
            return out
        if library._library().paged_prefill_attention_dpbf16(**args) == 0:
            return out
    library._library().paged_prefill_attention_f32(
        q=q.data_ptr(), **_kv_args(k_cache, v_cache), block_table=block_table.data_ptr(),
        query_start_loc=query_start_loc.data_ptr(), seq_lens=seq_lens.data_ptr(),
        out=out.data_ptr(), num_reqs=seq_lens.shape[0], num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
        max_blocks=block_table.shape[1], q_stride=q.stride(0), scale=scale, window=window,
        softcap=softcap, num_threads=torch.get_num_threads())
    return out


def rope_write_kv(qkv: torch.Tensor, positions: torch.Tensor,
                  cos_sin: tuple[torch.Tensor, torch.Tensor], slot_mapping: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int,
                  num_kv_heads: int, head_dim: int) -> None:
    """Rotates q and k in place in qkv [T, (H + 2 KVH) * D] (contiguous rows) and writes k
    and v at their slots (a QuantizedKV's quantized as kv_quant.quantize does). cos_sin: the
    full [max_positions, D] tables (see rope.py)."""
    cos, signed_sin = cos_sin
    library._library().rope_write_kv_f32(
        qkv=qkv.data_ptr(), row_stride=qkv.stride(0), positions=positions.data_ptr(),
        cos=cos.data_ptr(), signed_sin=signed_sin.data_ptr(), slots=slot_mapping.data_ptr(),
        **_kv_args(k_cache, v_cache), tokens=qkv.shape[0], num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, num_threads=torch.get_num_threads())
