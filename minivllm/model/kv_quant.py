"""Quantized KV caches: --kv-cache-dtype int8 | fp8 (= fp8_e4m3) | fp8_e5m2.

A quantized cache holds one byte per cached value and, beside the blocks, an fp32 scale per
token and KV head (symmetric: the head's largest |value| maps to the format's largest, as
vLLM's scaled fp8). A token's K (or V) is quantized once, when it is written; every reader
dequantizes as it reads: the C kernels in registers or in a block's rows
(model/kernels/kv_rows.h), the torch paths here. The scales travel with the blocks: a
QuantizedKV is one object for the runner's copies and swaps (`tensors`).

fp8 values are stored as uint8 bytes: torch has no index_copy or advanced indexing for its
fp8 dtypes on the CPU; the bytes are viewed as fp8 to convert them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QuantFormat:
    name: str
    dtype: torch.dtype  # what a stored byte means
    storage: torch.dtype  # what the cache tensor holds: int8, or the fp8 bytes as uint8
    qmax: float  # the largest magnitude: a head's absmax is stored as it
    kernel_type: int  # kernels.h's KV_* code
    # Keys stored smoothed (key_smoothing.py): int8's steps are uniform, so a key's outlier
    # channels cost its other channels their precision; fp8's steps follow each value's size
    # and smoothing made Qwen2.5-Coder's fp8 cache worse on sampled text (+1.24% -> +2.13%).
    smooth_keys: bool = False


FORMATS = {
    "int8": QuantFormat("int8", torch.int8, torch.int8, 127.0, 2, smooth_keys=True),
    "fp8_e4m3": QuantFormat("fp8_e4m3", torch.float8_e4m3fn, torch.uint8, 448.0, 3),
    "fp8_e5m2": QuantFormat("fp8_e5m2", torch.float8_e5m2, torch.uint8, 57344.0, 4),
}
FORMATS["fp8"] = FORMATS["fp8_e4m3"]  # vLLM's default fp8


def quantize(x: torch.Tensor, fmt: QuantFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (values [..., D] in fmt.storage, scales [...] fp32), with
    x ~= values * scale. The C write (ops.c) does the same fp32 operations, so that both
    store the same bytes: scale = absmax * (1 / qmax), values = round(x * (qmax / absmax))."""
    x = x.float()
    absmax = x.abs().amax(dim=-1)
    scales = absmax * (1 / fmt.qmax)  # 1 / qmax rounded to fp32: the C kernel's constant
    inv = torch.where(absmax > 0, torch.full_like(absmax, fmt.qmax) / absmax, 0.0)
    y = (x * inv.unsqueeze(-1)).clamp(-fmt.qmax, fmt.qmax)
    if fmt.dtype == torch.int8:
        return y.round().to(torch.int8), scales
    return y.to(fmt.dtype).view(torch.uint8), scales


def dequantize(values: torch.Tensor, scales: torch.Tensor, fmt: QuantFormat,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if fmt.storage != fmt.dtype:
        values = values.view(fmt.dtype)
    return values.to(dtype) * scales.unsqueeze(-1).to(dtype)


@dataclass(frozen=True)
class QuantizedKV:
    """One of K and V: data [..., num_blocks, block_size, KVH, D] and its scales
    [..., num_blocks, block_size, KVH]. Indexing the leading dimension (a layer, a list of
    blocks) indexes both."""

    data: torch.Tensor
    scales: torch.Tensor
    fmt: QuantFormat

    def __getitem__(self, index) -> QuantizedKV:
        return QuantizedKV(self.data[index], self.scales[index], self.fmt)

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(self.data, self.scales, self.fmt, dtype)

    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        """x [T, KVH, D] quantized into flat slots [T] (block * block_size + offset)."""
        values, scales = quantize(x, self.fmt)
        num_kv_heads, head_dim = x.shape[-2:]
        self.data.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, values)
        self.scales.view(-1, num_kv_heads).index_copy_(0, slots, scales)


def gather(cache: torch.Tensor | QuantizedKV, index: torch.Tensor,
           dtype: torch.dtype) -> torch.Tensor:
    """cache[index] as `dtype`: a quantized cache dequantized, a bf16 one widened."""
    if isinstance(cache, QuantizedKV):
        return cache[index].dequantized(dtype)
    return cache[index].to(dtype)


def tensors(caches) -> tuple[torch.Tensor, ...]:
    """The tensors behind caches (plain or QuantizedKV), in a fixed order: what a block copy
    or swap copies, the scales with their values."""
    out = ()
    for cache in caches:
        out += (cache.data, cache.scales) if isinstance(cache, QuantizedKV) else (cache,)
    return out
