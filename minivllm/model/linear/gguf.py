"""Linear layers over GGUF weight blocks as the file stores them (`quantization="gguf"`):
every block type of the common files (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K; their
layouts and torch decoding in kernels/gguf_blocks.py). A matrix [N, K] is N rows of K / 32
blocks (K / 256 super-blocks), rows along the output dimension, so whole rows can be permuted
or concatenated as bytes (model/gguf.py undoes llama.cpp's Q/K permutation so).

On the CPU with the C kernels built, the product runs as llama.cpp's does: activations
quantized per row and block of 32 to int8 (its q8_0 activations), each block's integer dot
product scaled by the two block scales and accumulated in fp32 (for the types with a
minimum, plus the block's minimum times the sum of its activations, llama.cpp's q8_1):
- with AVX2 or more, on the weights repacked at load into panels of 16 columns
  (gguf_repacked.c, gguf_ops.GGUF_REPACKED_TYPES), at every row count: decode and prefill
  alike, so a row's result does not depend on its batch;
- otherwise (Q2_K, Q3_K, or a CPU below AVX2) on the blocks as stored (gguf_gemm.c) below
  gguf_ops.GGUF_DEQUANT_MIN_ROWS rows, and from there in fp32: panels of output rows
  dequantized (gguf_dequant.c, as dequantize() computes) times x by torch's sgemm.
On a CPU with AMX, a batch of linear_ops.AMX_MIN_ROWS rows or more (a prefill) of the types
amx_gemm.c unpacks (gguf_ops.GGUF_AMX_TYPES) runs there instead: the blocks unpacked to bf16
tiles, x in bf16, products on AMX-BF16 (emulate_amx). Without the C kernels the reference
runs: the blocks dequantized once at load, and F.linear.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

import torch
import torch.nn.functional as F

from minivllm.model.kernels import fused_ops, gguf_blocks, gguf_ops, library, linear_ops
from minivllm.model.kernels.gguf_blocks import BLOCK, UNIT_BYTES, UNIT_VALUES
from minivllm.model.linear import repack_cache


class BlockWeight:
    """A linear's (or the token embeddings') weight [N, K] as GGUF blocks: uint8
    [N, K / unit values * unit bytes]. `blocks` may be given as row ranges to join (a fused
    q/k/v or gate/up, cat_rows): they are joined on first use of `blocks`, so a linear whose
    repacked weights come from the repack cache (repack_cache.py) never copies them.
    `source`: the GGUF tensors it holds ("+"-joined names), the repack cache's key; "" for
    blocks of no file."""

    def __init__(self, qtype: int, blocks: torch.Tensor | list[torch.Tensor],
                 source: str = "") -> None:
        self.qtype, self.source = qtype, source
        self._parts = [blocks] if isinstance(blocks, torch.Tensor) else list(blocks)

    @property
    def blocks(self) -> torch.Tensor:
        if len(self._parts) > 1:
            self._parts = [torch.cat(self._parts)]
        return self._parts[0]

    @property
    def device(self) -> torch.device:
        return self._parts[0].device

    @property
    def shape(self) -> tuple[int, int]:
        rows, row_bytes = sum(p.shape[0] for p in self._parts), self._parts[0].shape[1]
        return rows, row_bytes // UNIT_BYTES[self.qtype] * UNIT_VALUES[self.qtype]

    def to(self, device: torch.device, dtype: torch.dtype | None = None) -> BlockWeight:
        """On `device`; the blocks keep their type whatever `dtype` (runner.py moves every
        weight with its dtype)."""
        return BlockWeight(self.qtype, [p.to(device) for p in self._parts], self.source)

    def _units(self) -> torch.Tensor:
        rows, _ = self.shape
        return self.blocks.reshape(rows, -1, UNIT_BYTES[self.qtype])

    def integers(self) -> torch.Tensor:
        """Each value's integer as fp32 [N, K] (gguf_blocks.integers)."""
        return gguf_blocks.integers(self.qtype, self._units())

    def scales(self) -> torch.Tensor:
        """Each block of 32's scale as fp32 [N, K / 32] (what the kernel computes from the
        block's fp16 and 6-bit fields, gguf_scales.h)."""
        return gguf_blocks.scales(self.qtype, self._units())

    def mins(self) -> torch.Tensor | None:
        """Each block of 32's minimum as fp32 [N, K / 32]; None for the symmetric types."""
        return gguf_blocks.mins(self.qtype, self._units())

    def min_integers(self) -> torch.Tensor | None:
        """Each value's integer multiplier of its block's minimum, fp32 [N, K], where it is
        not 1 (Q2_K)."""
        return gguf_blocks.min_integers(self.qtype, self._units())

    def dequantize(self) -> torch.Tensor:
        """fp32 [N, K], equal to gguf.quants.dequantize of the same blocks."""
        w = self.scales().repeat_interleave(BLOCK, dim=1) * self.integers()
        mins, p = self.mins(), self.min_integers()
        if mins is None:
            return w
        mins = mins.repeat_interleave(BLOCK, dim=1)
        return w + (mins if p is None else mins * p)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` dequantized, fp32 [len(ids), K]: the token embeddings' lookup, which
        never dequantizes the whole table."""
        return BlockWeight(self.qtype, self.blocks.index_select(0, ids.flatten())).dequantize()


@dataclass
class BlockRows:
    """Weights stacked along the output dimension whose parts are blocks of different types
    (a fused q/k/v whose v is Q8_0 and q / k Q5_0, as Q4_K_M files have): each part runs
    its own kernel into its columns of the output."""

    parts: list[BlockWeight]

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.shape[0] for p in self.parts), self.parts[0].shape[1]

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])


def cat_rows(parts: list[torch.Tensor | BlockWeight]) -> torch.Tensor | BlockWeight | BlockRows:
    """Weights stacked along the output dimension (q/k/v, gate/up): blocks of one type stay
    one BlockWeight; blocks of several types a BlockRows, neighbours of one type joined; a
    mix with dequantized weights is dequantized (a part the kernels do not run)."""
    if not all(isinstance(p, BlockWeight) for p in parts):
        return torch.cat([p if isinstance(p, torch.Tensor) else p.dequantize() for p in parts])
    joined = []
    for qtype, run in groupby(parts, key=lambda p: p.qtype):
        run = list(run)
        sources = [p.source for p in run]
        joined.append(BlockWeight(qtype, [b for p in run for b in p._parts],
                                  "+".join(sources) if all(sources) else ""))
    return joined[0] if len(joined) == 1 else BlockRows(joined)


def quantize_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] fp32 -> (int8 [T, K], fp32 scales [T, K / 32]): per block of 32 values,
    symmetric, q = round(x * (127 / max|x|)), scale max|x| / 127 (1 for an all-zero block).
    The same fp32 operations as gguf_gemm.c's."""
    rows, k = x.shape
    blocks = x.float().reshape(rows, -1, BLOCK)
    amax = blocks.abs().amax(dim=2, keepdim=True)
    full = torch.full_like(amax, 127.0)  # see int8.quantize_per_group
    inv = torch.where(amax > 0, full / amax, torch.zeros_like(amax))
    scales = torch.where(amax > 0, amax / full, torch.ones_like(amax))
    return torch.round(blocks * inv).to(torch.int8).reshape(rows, k), scales.reshape(rows, -1)


def emulate_kernel(x: torch.Tensor, weight: BlockWeight) -> torch.Tensor:
    """What gguf_gemm.c computes, in torch (for its tests): int8 activation blocks times the
    weight blocks' integers, exact in fp32 (below 2^24: 32 * 127 * 127, Q6_K's 32 * 127 *
    32 * 128), times both scales, plus for the types with a minimum each block's minimum
    times the activation scale times the block's sum (Q2_K: weighted by its 4-bit
    minima)."""
    xq, x_scales = quantize_blocks(x)
    wq, w_scales, w_mins = weight.integers(), weight.scales(), weight.mins()
    p = weight.min_integers()
    acc = torch.zeros(x.shape[0], weight.shape[0])
    for b in range(x_scales.shape[1]):
        part = slice(b * BLOCK, (b + 1) * BLOCK)
        sx = x_scales[:, b:b + 1]
        acc += F.linear(xq[:, part].float(), wq[:, part]) * (sx * w_scales[:, b])
        if w_mins is not None:
            sums = (xq[:, part].float().sum(dim=1, keepdim=True) if p is None
                    else F.linear(xq[:, part].float(), p[:, part]))
            acc += sums * (sx * w_mins[:, b])
    return acc


def emulate_amx(x: torch.Tensor, weight: BlockWeight) -> torch.Tensor:
    """What amx_gemm.c computes from linear_ops.AMX_MIN_ROWS rows on a CPU with AMX (for its
    tests): each weight d * q (+ m) rounded once to fp32 (a fused multiply-add there) and
    then to bf16, times x rounded to bf16, accumulated in fp32."""
    w = weight.integers().double() * weight.scales().double().repeat_interleave(BLOCK, dim=1)
    mins = weight.mins()
    if mins is not None:
        w = w + mins.double().repeat_interleave(BLOCK, dim=1)
    return F.linear(x.float().bfloat16().float(), w.float().bfloat16().float())


class GGUFLinear:
    """y = x @ weight.T + bias (+ residual) over a BlockWeight, or a BlockRows (a kernel call
    per part, each giving its columns of y). x: [T, in_features] fp32.

    Where this CPU runs gguf_repacked.c (AVX2, AVX-512 VNNI), each part of
    gguf_ops.GGUF_REPACKED_TYPES is repacked once here and every call runs there, whatever
    its rows (so a row's result does not depend on its batch); the blocks are kept only on
    a CPU with AMX, whose prefill of gguf_ops.GGUF_AMX_TYPES runs on the tiles."""

    def __init__(self, weight: BlockWeight | BlockRows, bias: torch.Tensor | None = None,
                 use_kernel: bool = True) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else bias.float()
        parts = weight.parts if isinstance(weight, BlockRows) else [weight]
        self.use_kernel = use_kernel and library.available(parts[0].device, torch.float32)
        self.qtypes = [p.qtype for p in parts]
        self.part_rows = [p.shape[0] for p in parts]
        self.repacked: list[torch.Tensor | None] = [None] * len(parts)
        if not self.use_kernel:
            self.dequantized = weight.dequantize()
        elif library.gguf_repacked():
            self.repacked = [repack_cache.repacked(p, self.in_features) for p in parts]
        # the blocks are not read again once repacked (but by AMX's prefill): let them go
        # (unless shared), never joined or read where the repack cache had them
        self.blocks: list[torch.Tensor | None] = [
            p.blocks if r is None or library.amx() else None
            for p, r in zip(parts, self.repacked)]
        # silu_and_mul in the kernel's epilogue: one repacked part, no bias, whole panels
        self.fuses_silu = (len(parts) == 1 and self.repacked[0] is not None and bias is None
                           and self.out_features % 32 == 0
                           and library.gguf_repacked_silu_mul_supported())

    @property
    def step_bytes(self) -> int:
        """Bytes of weights one kernel call reads: the blocks (or as repacked), nothing
        beside them."""
        return sum(blocks.nbytes if r is None else r.nbytes
                   for blocks, r in zip(self.blocks, self.repacked))

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if not self.use_kernel:
            y = F.linear(x, self.dequantized, self.bias)
            return y if residual is None else residual + y
        outputs, start = [], 0
        for qtype, n, blocks, repacked in zip(self.qtypes, self.part_rows, self.blocks,
                                              self.repacked):
            end = start + n
            bias = None if self.bias is None else self.bias[start:end]
            res = None if residual is None else residual[:, start:end]
            if repacked is not None and not self._on_tiles(x.shape[0], qtype):
                outputs.append(gguf_ops.gguf_repacked_linear(x, repacked, qtype, bias, res, n))
            else:
                outputs.append(gguf_ops.gguf_linear(x, blocks, qtype, bias, res, n))
            start = end
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up [T, out_features / 2] of a fused gate/up linear ([gate | up]
        columns; the C kernels built): in the kernel's epilogue where it runs (fuses_silu;
        not a prefill the AMX tiles take), else this linear then fused_ops.silu_and_mul — the same
        values either way. A 512-token prompt on Qwen2.5-0.5B spent 18 ms of its 370 in
        silu_and_mul, most of it reading back the 20 MB gate/up output the fused pass never
        writes."""
        if self.fuses_silu and not self._on_tiles(x.shape[0], self.qtypes[0]):
            return gguf_ops.gguf_repacked_silu_mul(x, self.repacked[0], self.qtypes[0],
                                                   self.out_features)
        return fused_ops.silu_and_mul(self(x))

    @staticmethod
    def _on_tiles(rows: int, qtype: int) -> bool:
        """Whether a call of `rows` rows runs on AMX tiles (amx_gemm.c)."""
        return (rows >= linear_ops.AMX_MIN_ROWS and qtype in gguf_ops.GGUF_AMX_TYPES
                and library.amx())
