"""Paged attention on the CPU (or any torch device).

K and V of every layer live in blocks: [num_blocks, block_size, num_kv_heads, head_dim],
fp32, bf16, or one byte per value with a scale per token and KV head (kv_quant.py's
QuantizedKV: --kv-cache-dtype int8 / fp8), quantized when written and dequantized as read.
Each step writes its new K/V at the tokens' slots, then every request attends over its
own blocks. `reference_attention` gathers each request's blocks and runs one causal SDPA
per request — the oracle. The fast path batches all one-token (decode) requests, which the
runner puts first, together — in the C kernel reading blocks through the block table when
it is available (CPU, fp32), else as one masked SDPA over padded gathered contexts — and
runs the multi-token (prefill) chunks after them: in the C prefill kernel (causal by
position, tiles of queries against each block, read in place), else one SDPA per request.
The rows of a request that verifies drafts run with the decodes, each as a one-token decode
over its own prefix: the decode kernel then computes them as it would one token at a time,
and the verification keeps the tokens a decode would have picked (the prefill kernel sums in
another order; a last-bit difference, which int8-quantized activations can grow into a flip
of a near-tie).

Every path takes a layer's sliding `window` (> 0: a query attends to its last `window`
positions, itself included, as transformers' sliding_window) and Gemma 2's logit `softcap`
(> 0: scores become softcap * tanh(score / softcap) before the mask and softmax).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from minivllm.model.kernels import attention_ops
from minivllm.model.kv_quant import QuantizedKV, gather

# A layer's K or V cache: a tensor (fp32, bf16), or values and scales (kv_quant.py)
Cache = torch.Tensor | QuantizedKV


@dataclass
class AttentionMetadata:
    """One step's batch, decodes first: requests 0 .. num_decodes - 1 have one query token
    each (token rows 0 .. num_decodes - 1), the next num_verifies verify drafts (their last
    token and drafts), the rest are prefill chunks."""

    slot_mapping: torch.Tensor  # [T] flat slot (block * block_size + offset) of each new token
    block_table: torch.Tensor  # [B, max_blocks] long, each row padded with block 0
    seq_lens: torch.Tensor  # [B] long: context length per request after this step
    query_start_loc: torch.Tensor  # [B + 1] long: where each request's tokens start
    num_decodes: int
    num_tokens: int  # real tokens: q may have padding rows after them (runner.py)
    block_size: int
    use_reference: bool = False  # the per-request oracle (tests)
    use_kernel: bool = False  # the C kernels (CPU, fp32, kernels built)
    num_verifies: int = 0

    @property
    def num_requests(self) -> int:
        return self.block_table.shape[0]


def write_kv(k_cache: Cache, v_cache: Cache, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    if isinstance(k_cache, QuantizedKV):  # quantized once, here
        k_cache.write(slot_mapping, k)
        v_cache.write(slot_mapping, v)
        return
    num_kv_heads, head_dim = k.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
          scale: float, softcap: float) -> torch.Tensor:
    """q: [B, H, n, D], k and v: [B, KVH, L, D], mask: True where seen. SDPA has no logit
    cap, so a capped layer runs the same steps by hand (as transformers' eager attention)."""
    if not softcap:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                              enable_gqa=True)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.tanh(q @ k.transpose(-1, -2) * scale / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _one_request(q: torch.Tensor, k_cache: Cache, v_cache: Cache,
                 table: torch.Tensor, seq_len: int, scale: float, window: int = 0,
                 softcap: float = 0.0) -> torch.Tensor:
    """q: [n, H, D] of one request's new tokens, the last n of its seq_len positions."""
    query_len, block_size = q.shape[0], k_cache.shape[1]
    # With a window, the blocks before the first query's window are not even gathered.
    skipped = max(0, seq_len - query_len - window + 1) // block_size if window else 0
    length = seq_len - skipped * block_size  # the context gathered, from block `skipped`
    # a bf16 or quantized cache (--kv-cache-dtype) read as q's dtype
    k = gather(k_cache, table[skipped:], q.dtype).flatten(0, 1)[:length].transpose(0, 1)
    v = gather(v_cache, table[skipped:], q.dtype).flatten(0, 1)[:length].transpose(0, 1)
    k, v = k.unsqueeze(0), v.unsqueeze(0)
    mask = None
    if query_len > 1 or 0 < window < length:  # query i sits at position length - query_len + i
        mask = torch.ones(query_len, length, dtype=torch.bool, device=q.device)
        mask = mask.tril(diagonal=length - query_len)
        if window:
            mask = mask.triu(diagonal=length - query_len - window + 1)
    out = _sdpa(q.transpose(0, 1).unsqueeze(0), k, v, mask, scale, softcap)
    return out.squeeze(0).transpose(0, 1)


def reference_attention(q: torch.Tensor, k_cache: Cache, v_cache: Cache,
                        meta: AttentionMetadata, scale: float, window: int = 0,
                        softcap: float = 0.0) -> torch.Tensor:
    """q: [T, num_heads, head_dim] -> [T, num_heads, head_dim]. One SDPA per request."""
    out = torch.empty_like(q)
    starts, seq_lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
    for i, seq_len in enumerate(seq_lens):
        table = meta.block_table[i, :-(-seq_len // meta.block_size)]
        start, end = starts[i], starts[i + 1]
        out[start:end] = _one_request(q[start:end], k_cache, v_cache, table, seq_len, scale,
                                      window, softcap)
    return out


def decode_attention(q: torch.Tensor, k_cache: Cache, v_cache: Cache,
                     block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
                     use_kernel: bool, scale: float, window: int = 0,
                     softcap: float = 0.0) -> torch.Tensor:
    """q: [B, H, D], one new token per request."""
    if use_kernel:
        return attention_ops.paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens,
                                                    scale, window, softcap)
    return padded_decode_attention(q, k_cache, v_cache, block_table, seq_lens, block_size,
                                   scale, window, softcap)


def padded_decode_attention(q: torch.Tensor, k_cache: Cache, v_cache: Cache,
                            block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
                            scale: float, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """The portable decode path: gather padded contexts, one masked SDPA."""
    k = gather(k_cache, block_table, q.dtype).flatten(1, 2).transpose(1, 2)  # [B, KVH, L, D]
    v = gather(v_cache, block_table, q.dtype).flatten(1, 2).transpose(1, 2)
    positions = torch.arange(block_table.shape[1] * block_size, device=q.device)
    mask = positions[None, :] < seq_lens[:, None]
    if window:
        mask &= positions[None, :] >= seq_lens[:, None] - window
    out = _sdpa(q.unsqueeze(2), k, v, mask[:, None, None, :], scale, softcap)  # [B, 1, 1, L]
    return out.squeeze(2)


def prefill_attention(q: torch.Tensor, k_cache: Cache, v_cache: Cache,
                      meta: AttentionMetadata, scale: float, window: int = 0,
                      softcap: float = 0.0) -> torch.Tensor:
    """q: [T_prefill, H, D], the tokens of requests num_decodes .. B - 1."""
    first = meta.num_decodes
    starts = meta.query_start_loc[first:] - meta.query_start_loc[first]
    if meta.use_kernel:  # reads the paged cache in place: no gathered copy, no dense mask
        return attention_ops.paged_prefill_attention(q, k_cache, v_cache, meta.block_table[first:],
                                                     starts, meta.seq_lens[first:], scale, window,
                                                     softcap)
    out = torch.empty_like(q)
    bounds, seq_lens = starts.tolist(), meta.seq_lens[first:].tolist()
    for i, seq_len in enumerate(seq_lens):
        table = meta.block_table[first + i, :-(-seq_len // meta.block_size)]
        out[bounds[i]:bounds[i + 1]] = _one_request(q[bounds[i]:bounds[i + 1]], k_cache,
                                                    v_cache, table, seq_len, scale, window,
                                                    softcap)
    return out


def paged_attention(q: torch.Tensor, k_cache: Cache, v_cache: Cache,
                    meta: AttentionMetadata, scale: float, window: int = 0,
                    softcap: float = 0.0) -> torch.Tensor:
    if q.shape[0] > meta.num_tokens:  # padding rows: attend for the real ones only
        out = torch.empty_like(q)
        out[:meta.num_tokens] = paged_attention(q[:meta.num_tokens], k_cache, v_cache, meta,
                                                scale, window, softcap)
        return out
    if meta.use_reference:
        return reference_attention(q, k_cache, v_cache, meta, scale, window, softcap)
    num_decodes = meta.num_decodes + meta.num_verifies  # requests attending as decodes
    block_table, seq_lens = decode_rows(meta, num_decodes)
    if num_decodes == meta.num_requests:
        return decode_attention(q, k_cache, v_cache, block_table, seq_lens, meta.block_size,
                                meta.use_kernel, scale, window, softcap)
    if num_decodes == 0:
        return prefill_attention(q, k_cache, v_cache, meta, scale, window, softcap)
    rows = len(seq_lens)
    out = torch.empty_like(q)
    out[:rows] = decode_attention(q[:rows], k_cache, v_cache, block_table, seq_lens,
                                  meta.block_size, meta.use_kernel, scale, window, softcap)
    out[rows:] = prefill_attention(q[rows:], k_cache, v_cache,
                                   replace(meta, num_decodes=num_decodes), scale, window,
                                   softcap)
    return out


def decode_rows(meta: AttentionMetadata, num_requests: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The block table and context length of each token row of requests 0 .. num_requests - 1
    as one-token decodes: row j of a request's n rows attends to its first seq_len - n + 1 + j
    positions."""
    if not meta.num_verifies:  # one row each
        return meta.block_table[:num_requests], meta.seq_lens[:num_requests]
    loc = meta.query_start_loc[:num_requests + 1]
    owner = torch.repeat_interleave(torch.arange(num_requests, device=loc.device),
                                    loc[1:] - loc[:-1])
    rows_after = loc[1:][owner] - 1 - torch.arange(len(owner), device=loc.device)
    return meta.block_table[owner], meta.seq_lens[owner] - rows_after
