"""Linear layers over GGUF weight blocks as the file stores them (`quantization="gguf"`):
Q8_0, Q4_0 and Q4_1, llama.cpp's blocks of 32 input values with one fp16 scale each,
  Q8_0: 2-byte scale d, 32 int8 q;          w = d * q
  Q4_0: 2-byte scale d, 16 bytes of nibbles; w = d * (nibble - 8), the low nibbles are
        values 0..15 of the block, the high nibbles values 16..31;
  Q4_1: 2-byte scale d, 2-byte minimum m, 16 bytes of nibbles as Q4_0's; w = d * nibble + m;
and Q4_K, a super-block of 256 values (144 bytes: fp16 d and dmin, 12 bytes of 6-bit scales
sc and minima m for its 8 blocks of 32, 128 bytes of nibbles; each 32 bytes hold two blocks,
the low nibbles one, the high the next); w = d * sc * nibble - dmin * m, which is Q4_1's form
with each block's scale d * sc and minimum -dmin * m (computed once at load, as fp32).
A matrix [N, K] is N rows of K / 32 blocks (K / 256 super-blocks), rows along the output dimension, so whole rows
can be permuted or concatenated as bytes (gguf.py undoes llama.cpp's Q/K permutation so).

On the CPU with the C kernels built, gguf_gemm.c runs the product as llama.cpp does:
activations quantized per row and block of 32 to int8 (its q8_0 activations), each block's
integer dot product scaled by the two block scales and accumulated in fp32 (for Q4_1 and
Q4_K plus the block's minimum times the sum of its activations, llama.cpp's q8_1). On a CPU with AMX,
a batch of cpu.AMX_MIN_ROWS rows or more (a prefill) runs amx_gemm.c instead: the blocks
unpacked to bf16 tiles, x in bf16, products on AMX-BF16 (emulate_amx). Elsewhere the
reference runs: the blocks dequantized once at load, and F.linear.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minivllm.model.kernels import cpu

Q4_0, Q4_1, Q8_0, Q4_K = 2, 3, 8, 12  # gguf.GGMLQuantizationType values
BLOCK = 32  # values per block (per scale)
# Values and bytes of the unit the file stores: a block, or Q4_K's super-block of 8 blocks
UNIT_VALUES = {Q8_0: 32, Q4_0: 32, Q4_1: 32, Q4_K: 256}
BLOCK_BYTES = {Q8_0: 34, Q4_0: 18, Q4_1: 20, Q4_K: 144}
HEADER_BYTES = {Q8_0: 2, Q4_0: 2, Q4_1: 4, Q4_K: 16}  # scales (and minima), then the values
TYPE_NAMES = {Q8_0: "Q8_0", Q4_0: "Q4_0", Q4_1: "Q4_1", Q4_K: "Q4_K"}


@dataclass
class BlockWeight:
    """A linear's weight [N, K] as GGUF blocks: uint8 [N, K / unit values * unit bytes]."""

    qtype: int
    blocks: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        rows, row_bytes = self.blocks.shape
        return rows, row_bytes // BLOCK_BYTES[self.qtype] * UNIT_VALUES[self.qtype]

    def to(self, device: torch.device, dtype: torch.dtype | None = None) -> BlockWeight:
        """On `device`; the blocks keep their type whatever `dtype` (runner.py moves every
        weight with its dtype)."""
        return BlockWeight(self.qtype, self.blocks.to(device))

    def _blocks(self) -> torch.Tensor:
        rows, _ = self.shape
        return self.blocks.reshape(rows, -1, BLOCK_BYTES[self.qtype])

    def integers(self) -> torch.Tensor:
        """Each block's integers as fp32 [N, K]: Q8_0's int8, Q4_0's nibble - 8, Q4_1's and
        Q4_K's nibble."""
        rows, _ = self.shape
        values = self._blocks()[..., HEADER_BYTES[self.qtype]:]
        if self.qtype == Q8_0:
            return values.contiguous().view(torch.int8).float().reshape(rows, -1)
        if self.qtype == Q4_K:  # 4 x 32 bytes: low nibbles one block, high nibbles the next
            values = values.reshape(rows, -1, 4, 1, 32)
            return torch.cat([values & 0xF, values >> 4], dim=3).float().reshape(rows, -1)
        q = torch.cat([values & 0xF, values >> 4], dim=-1).float()
        return (q - 8 if self.qtype == Q4_0 else q).reshape(rows, -1)

    def scales(self) -> torch.Tensor:
        """Each block's scale as fp32 [N, K / 32] (the kernel reads them so, not as fp16):
        d, or Q4_K's d * sc."""
        if self.qtype == Q4_K:
            sc, _ = self._q4_k_scales_and_mins()
            return (_half(self._blocks()[..., 0:2]).unsqueeze(-1) * sc).flatten(1)
        return _half(self._blocks()[..., 0:2])

    def mins(self) -> torch.Tensor | None:
        """Each block's minimum as fp32 [N, K / 32]: Q4_1's m, Q4_K's -dmin * m; None for
        the symmetric types."""
        if self.qtype == Q4_K:
            _, m = self._q4_k_scales_and_mins()
            return -(_half(self._blocks()[..., 2:4]).unsqueeze(-1) * m).flatten(1)
        return _half(self._blocks()[..., 2:4]) if self.qtype == Q4_1 else None

    def _q4_k_scales_and_mins(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Q4_K's 6-bit scales and minima of each super-block's 8 blocks, fp32 [N, S, 8]:
        bytes 0-3 hold blocks 0-3's scales (and in their top 2 bits, the top bits of
        blocks 4-7's), bytes 4-7 their minima (the same), bytes 8-11 blocks 4-7's low 4
        bits of scale (low nibble) and minimum (high nibble)."""
        packed = self._blocks()[..., 4:16].int()
        low, high, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
        sc = torch.cat([low & 63, (rest & 15) | ((low >> 6) << 4)], dim=-1)
        m = torch.cat([high & 63, (rest >> 4) | ((high >> 6) << 4)], dim=-1)
        return sc.float(), m.float()

    def dequantize(self) -> torch.Tensor:
        """fp32 [N, K], equal to gguf.quants.dequantize of the same blocks."""
        scales = self.scales().repeat_interleave(BLOCK, dim=1)
        w = scales * self.integers()
        mins = self.mins()
        return w if mins is None else w + mins.repeat_interleave(BLOCK, dim=1)


def _half(pairs: torch.Tensor) -> torch.Tensor:
    """[N, units, 2] bytes read as fp16 -> fp32 [N, units]."""
    return pairs.contiguous().view(torch.float16).float().squeeze(-1)


def cat_rows(parts: list[torch.Tensor | BlockWeight]) -> torch.Tensor | BlockWeight:
    """Weights stacked along the output dimension (q/k/v, gate/up): blocks of one type stay
    blocks; a mix is dequantized (a layer runs one kernel)."""
    if all(isinstance(p, BlockWeight) for p in parts) and len({p.qtype for p in parts}) == 1:
        return BlockWeight(parts[0].qtype, torch.cat([p.blocks for p in parts]))
    return torch.cat([p.dequantize() if isinstance(p, BlockWeight) else p for p in parts])


def quantize_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] fp32 -> (int8 [T, K], fp32 scales [T, K / 32]): per block of 32 values,
    symmetric, q = round(x * (127 / max|x|)), scale max|x| / 127 (1 for an all-zero block).
    The same fp32 operations as gguf_gemm.c's."""
    rows, k = x.shape
    blocks = x.float().reshape(rows, -1, BLOCK)
    amax = blocks.abs().amax(dim=2, keepdim=True)
    full = torch.full_like(amax, 127.0)  # see linear_int8.quantize_per_group
    inv = torch.where(amax > 0, full / amax, torch.zeros_like(amax))
    scales = torch.where(amax > 0, amax / full, torch.ones_like(amax))
    return torch.round(blocks * inv).to(torch.int8).reshape(rows, k), scales.reshape(rows, -1)


def emulate_kernel(x: torch.Tensor, weight: BlockWeight) -> torch.Tensor:
    """What gguf_gemm.c computes, in torch (for its tests): int8 activation blocks times the
    weight blocks' integers, exact in fp32 (32 * 127 * 127 < 2^24), times both scales, plus
    for Q4_1 and Q4_K each block's minimum times the activation scale times the block's
    sum."""
    xq, x_scales = quantize_blocks(x)
    wq, w_scales, w_mins = weight.integers(), weight.scales(), weight.mins()
    acc = torch.zeros(x.shape[0], weight.shape[0])
    for b in range(x_scales.shape[1]):
        part = slice(b * BLOCK, (b + 1) * BLOCK)
        sx = x_scales[:, b:b + 1]
        acc += F.linear(xq[:, part].float(), wq[:, part]) * (sx * w_scales[:, b])
        if w_mins is not None:
            acc += xq[:, part].float().sum(dim=1, keepdim=True) * (sx * w_mins[:, b])
    return acc


def emulate_amx(x: torch.Tensor, weight: BlockWeight) -> torch.Tensor:
    """What amx_gemm.c computes from cpu.AMX_MIN_ROWS rows on a CPU with AMX (for its
    tests): each weight d * q (+ m) rounded once to fp32 (a fused multiply-add there) and
    then to bf16, times x rounded to bf16, accumulated in fp32."""
    w = weight.integers().double() * weight.scales().double().repeat_interleave(BLOCK, dim=1)
    mins = weight.mins()
    if mins is not None:
        w = w + mins.double().repeat_interleave(BLOCK, dim=1)
    return F.linear(x.float().bfloat16().float(), w.float().bfloat16().float())


class GGUFLinear:
    """y = x @ weight.T + bias (+ residual) over a BlockWeight. x: [T, in_features] fp32."""

    def __init__(self, weight: BlockWeight, bias: torch.Tensor | None = None,
                 use_kernel: bool = True) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else bias.float()
        self.use_kernel = use_kernel and cpu.available(weight.blocks.device, torch.float32)
        if self.use_kernel:
            self.weight, self.scales, self.mins = weight, weight.scales(), weight.mins()
        else:
            self.dequantized = weight.dequantize()

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.use_kernel:
            return cpu.gguf_linear(x, self.weight.blocks, self.scales, self.mins,
                                   self.weight.qtype, self.bias, residual, self.out_features)
        y = F.linear(x, self.dequantized, self.bias)
        return y if residual is None else residual + y
