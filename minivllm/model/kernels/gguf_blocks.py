"""GGUF's weight block types as the file stores them, decoded in torch: the reference that
gguf_gemm.c is tested against (model/linear/gguf.py), and the dequantization of blocks the
kernels do not run. gguf_gemm.c's top comment draws each layout.

Every type is read as blocks of 32 input values, each block's weights w = d * q + m * p:
  q: the block's integers, what the kernel multiplies by the int8 activations (for Q2_K,
     Q3_K and Q6_K, whose scales are integers per 16 values, q includes that scale);
  d: the block's fp32 scale (Q4_K / Q5_K: d * sc; Q2_K / Q3_K / Q6_K: the super-block's d);
  m: the block's fp32 minimum, for the types with one (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K);
  p: each value's integer multiplier of m: Q2_K's 4-bit minimum of its 16 values, else 1.
Each product and sum here is exact or rounded once, as the gguf package's dequantizers are,
so dequantize() equals gguf.quants.dequantize bit for bit (the tests check it per type).
"""

from __future__ import annotations

import torch

# gguf.GGMLQuantizationType values
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 2, 3, 6, 7, 8, 10, 11, 12, 13, 14
TYPE_NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0",
              Q2_K: "Q2_K", Q3_K: "Q3_K", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K"}
K_TYPES = (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)  # super-blocks of 256 values (8 blocks)
# Values and bytes of the unit the file stores: a block, or a super-block
UNIT_VALUES = {qtype: 256 if qtype in K_TYPES else 32 for qtype in TYPE_NAMES}
UNIT_BYTES = {Q4_0: 18, Q4_1: 20, Q5_0: 22, Q5_1: 24, Q8_0: 34,
              Q2_K: 84, Q3_K: 110, Q4_K: 144, Q5_K: 176, Q6_K: 210}
BLOCK = 32


def integers(qtype: int, units: torch.Tensor) -> torch.Tensor:
    """q of every value, fp32 [N, K], from units uint8 [N, U, unit bytes]."""
    u = units
    if qtype == Q8_0:
        q = u[..., 2:].contiguous().view(torch.int8).int()
    elif qtype in (Q4_0, Q4_1):
        q = _nibbles(u[..., 2 if qtype == Q4_0 else 4:]) - (8 if qtype == Q4_0 else 0)
    elif qtype in (Q5_0, Q5_1):
        at = 2 if qtype == Q5_0 else 4  # the 32 fifth bits, then the nibbles
        q = _nibbles(u[..., at + 4:]) + 16 * _bits(u[..., at:at + 4])
        q = q - 16 if qtype == Q5_0 else q
    elif qtype == Q2_K:
        q = _crumbs(u[..., 16:80]) * _sub_scales(qtype, u).repeat_interleave(16, dim=-1)
    elif qtype == Q3_K:
        q = _crumbs(u[..., 32:96]) + 4 * _bits(u[..., 0:32]) - 4
        q = q * _sub_scales(qtype, u).repeat_interleave(16, dim=-1)
    elif qtype in (Q4_K, Q5_K):
        q = _k_nibbles(u[..., 16:144] if qtype == Q4_K else u[..., 48:176])
        if qtype == Q5_K:
            q = q + 16 * _bits(u[..., 16:48])
    elif qtype == Q6_K:
        low = u[..., 0:128].reshape(*u.shape[:-1], 2, 1, 64) >> _shifts(0, 4)
        q = (low & 15).flatten(-3) + 16 * _crumbs(u[..., 128:192]) - 32
        q = q * _sub_scales(qtype, u).repeat_interleave(16, dim=-1)
    else:
        raise ValueError(f"GGUF type {qtype} is not a block type read here")
    return q.float().flatten(1)


def scales(qtype: int, units: torch.Tensor) -> torch.Tensor:
    """d of every block of 32, fp32 [N, K / 32]."""
    if qtype in (Q4_K, Q5_K):
        sc, _ = _k_scales_and_mins(units)
        return (_half(units, 0).unsqueeze(-1) * sc).flatten(1)
    if qtype in K_TYPES:  # one d per super-block, at its end (Q2_K: before dmin)
        at = {Q2_K: 80, Q3_K: 108, Q6_K: 208}[qtype]
        return _half(units, at).repeat_interleave(8, dim=1)
    return _half(units, 0)


def mins(qtype: int, units: torch.Tensor) -> torch.Tensor | None:
    """m of every block of 32, fp32 [N, K / 32]; None for the symmetric types."""
    if qtype in (Q4_K, Q5_K):
        _, m = _k_scales_and_mins(units)
        return -(_half(units, 2).unsqueeze(-1) * m).flatten(1)
    if qtype == Q2_K:
        return -_half(units, 82).repeat_interleave(8, dim=1)
    return _half(units, 2) if qtype in (Q4_1, Q5_1) else None


def min_integers(qtype: int, units: torch.Tensor) -> torch.Tensor | None:
    """p of every value, fp32 [N, K], where it is not 1: Q2_K's 4-bit minima."""
    if qtype != Q2_K:
        return None
    return (units[..., 0:16] >> 4).float().repeat_interleave(16, dim=-1).flatten(1)


def _half(units: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 at byte `at` of each unit as fp32 [N, U]."""
    return units[..., at:at + 2].contiguous().view(torch.float16).float().squeeze(-1)


def _shifts(*counts: int) -> torch.Tensor:
    """Right-shift counts along the second-to-last axis."""
    return torch.tensor(counts, dtype=torch.uint8).reshape(-1, 1)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 values: the low nibbles (values 0..15), then the high."""
    return torch.cat([packed & 15, packed >> 4], dim=-1).int()


def _k_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """4 x 32 bytes -> 256 values: of each 32 bytes, the low nibbles, then the high."""
    groups = packed.reshape(*packed.shape[:-1], 4, 1, 32) >> _shifts(0, 4)
    return (groups & 15).flatten(-3).int()


def _crumbs(packed: torch.Tensor) -> torch.Tensor:
    """2 x 32 bytes -> 256 values: of each 32 bytes, bits 0-1, then 2-3, 4-5, 6-7."""
    groups = packed.reshape(*packed.shape[:-1], 2, 1, 32) >> _shifts(0, 2, 4, 6)
    return (groups & 3).flatten(-3).int()


def _bits(packed: torch.Tensor) -> torch.Tensor:
    """One bit per value: 4 bytes -> 32 values (value j: bit j % 8 of byte j // 8, a
    little-endian uint32's bit j); 32 bytes -> 256 values (block s's value j: bit s of
    byte j)."""
    if packed.shape[-1] == 4:
        planes = packed.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)
    else:
        planes = packed.unsqueeze(-2) >> _shifts(*range(8))
    return (planes & 1).flatten(-2).int()


def _sub_scales(qtype: int, units: torch.Tensor) -> torch.Tensor:
    """The integer scale of each 16 values, int32 [N, U, 16]: Q6_K's int8; Q3_K's 6 bits -
    32 (low 4 bits: bytes 96-103, low nibbles first; high 2: bytes 104-107, bits 0-1 first);
    Q2_K's low nibbles."""
    if qtype == Q6_K:
        return units[..., 192:208].contiguous().view(torch.int8).int()
    if qtype == Q2_K:
        return (units[..., 0:16] & 15).int()
    low = _nibbles(units[..., 96:104])
    high = ((units[..., 104:108].unsqueeze(-2) >> _shifts(0, 2, 4, 6)) & 3).flatten(-2).int()
    return (low | (high << 4)) - 32


def _k_scales_and_mins(units: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's and Q5_K's 6-bit scales and minima of each super-block's 8 blocks, fp32
    [N, U, 8]: bytes 4-7 hold blocks 0-3's scales (and in their top 2 bits, the top bits of
    blocks 4-7's), bytes 8-11 their minima (the same), bytes 12-15 blocks 4-7's low 4 bits
    of scale (low nibble) and minimum (high nibble)."""
    packed = units[..., 4:16].int()
    low, high, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([low & 63, (rest & 15) | ((low >> 6) << 4)], dim=-1)
    m = torch.cat([high & 63, (rest >> 4) | ((high >> 6) << 4)], dim=-1)
    return sc.float(), m.float()
