"""The GGUF kernels behind torch-facing wrappers (the linear that runs them:
model/linear/gguf.py): products over a GGUF file's weight blocks as stored (gguf_gemm.c,
amx_gemm.c), or repacked into panels (gguf_repack.c, gguf_repacked.c), and the blocks
dequantized to fp32 (gguf_dequant.c), which a prefill's rows multiply with sgemm. fp32
activations in and out."""

from __future__ import annotations

import threading

import torch

from minivllm.model.kernels import library
from minivllm.model.kernels.linear_ops import AMX_MIN_ROWS, LinearOperands

# The GGUF block types amx_gemm.c unpacks to bf16 tiles (Q4_0, Q4_1, Q8_0, Q4_K). The others
# run gguf_gemm.c at every batch size: their unpacking to tiles is not written yet.
GGUF_AMX_TYPES = (2, 3, 8, 12)


# From this many rows (a prefill, or a large batch) a GGUF linear without AMX runs as panels
# of output rows dequantized to fp32 (gguf_dequant.c) and torch's sgemm: the int8 kernel
# unpacks a block for 4 rows at a time, sgemm runs 2-3x its GFLOP/s. Below, the int8 kernel
# reads the blocks once for all rows, which a memory-bound decode step wants. Roughly
# measured on one layer of Qwen2.5-0.5B's Q4_K_M linears (Xeon, AVX-512 VNNI, 2 threads,
# shared machine): the int8 kernel 1.2x faster at 16 rows, even at 24, panels 1.25x
# faster at 32, 2.3x at 128, 2.8x at 512.
GGUF_DEQUANT_MIN_ROWS = 24
# fp32 bytes of one panel: a 151936-row LM head never needs its 545 MB at once
GGUF_PANEL_BYTES = 4 << 20
_panel_buffers = threading.local()


def gguf_dequantize(blocks: torch.Tensor, qtype: int, k: int, start: int = 0,
                    end: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows [start, end) of GGUF blocks (uint8 [N, row bytes]) as fp32 [end - start, k],
    bit for bit gguf.quants.dequantize (BlockWeight.dequantize()'s values; a zero may carry
    the other sign), into `out` if given (contiguous, at least that many values). See
    gguf_dequant.c."""
    end = blocks.shape[0] if end is None else end
    out = (torch.empty((end - start) * k, dtype=torch.float32) if out is None
           else out.view(-1)[:(end - start) * k])
    status = library._library().gguf_dequantize_f32(
        blocks=blocks.data_ptr(), qtype=qtype, k=k, n0=start, n1=end, out=out.data_ptr(),
        num_threads=torch.get_num_threads())
    if status != 0:
        raise ValueError(f"gguf_dequantize: GGUF type {qtype} with K={k} is not a block type "
                         "the kernel reads (blocks of 32; the K types' super-blocks of 256)")
    return out.view(end - start, k)


def _gguf_linear_panels(x: torch.Tensor, blocks: torch.Tensor, qtype: int,
                        bias: torch.Tensor | None, residual: torch.Tensor | None,
                        y: torch.Tensor) -> torch.Tensor:
    """gguf_linear in fp32 for many rows: y starts as bias + residual, then each panel of
    output rows is dequantized into one reused buffer (per thread) and added into its
    columns of y by sgemm (writing y's strided columns in place)."""
    n, k = y.shape[1], x.shape[1]
    panel = max(1, GGUF_PANEL_BYTES // (4 * k))
    buffer = getattr(_panel_buffers, "fp32", None)
    if buffer is None or buffer.numel() < min(panel, n) * k:  # grows to the largest panel
        buffer = _panel_buffers.fp32 = torch.empty(min(panel, n) * k)
    if residual is not None:
        y.copy_(residual if bias is None else residual + bias)
    elif bias is not None:
        y.copy_(bias.expand_as(y))
    beta = 0 if residual is None and bias is None else 1  # 0: y's contents never read
    for start in range(0, n, panel):
        end = min(start + panel, n)
        w = gguf_dequantize(blocks, qtype, k, start, end, out=buffer)
        y[:, start:end].addmm_(x, w.t(), beta=beta)
    return y


# The GGUF block types gguf_repacked.c holds (all but Q2_K and Q3_K, which stay blocks)
GGUF_REPACKED_TYPES = (2, 3, 6, 7, 8, 12, 13, 14)


def gguf_repack(blocks: torch.Tensor, qtype: int, k: int,
                out: torch.Tensor | None = None) -> torch.Tensor | None:
    """GGUF blocks (uint8 [N, row bytes]) repacked for gguf_repacked_linear (uint8, the file's
    bytes per weight; into `out` if given, of that size), or None where not repacked (another
    type, or not this CPU). Panels are 16 rows each, so blocks of a multiple of 16 rows
    repack to the first bytes of their join's repacked weights."""
    n, lib = blocks.shape[0], library._library()
    size = lib.gguf_repacked_bytes(qtype=qtype, k=k, n=n)
    if not size or not library.gguf_repacked():
        return None
    repacked = torch.empty(size, dtype=torch.uint8) if out is None else out
    if repacked.numel() != size:
        raise ValueError(f"gguf_repack: out holds {repacked.numel()} bytes, not {size}")
    lib.gguf_repack(blocks=blocks.contiguous().data_ptr(), qtype=qtype, k=k, n=n,
                    repacked=repacked.data_ptr(), num_threads=torch.get_num_threads())
    return repacked


_scratch = threading.local()  # per thread: a kernel call's scratch is its own until it returns
_SCRATCH_SHAPES = 32  # (rows, K) kept; past it the lot is dropped (prompts come in many sizes)


def _activation_buffers(rows: int, k: int) -> dict[str, int]:
    """Scratch for x quantized per row and block of 32 (gguf_activations.h), as the kernels'
    address arguments: kept per thread and shape and reused, since allocating the three
    tensors was a third of a decode step's per-linear Python time (~5 of 15 us)."""
    kept = getattr(_scratch, "shapes", None)
    if kept is None or len(kept) >= _SCRATCH_SHAPES:
        kept = _scratch.shapes = {}
    entry = kept.get((rows, k))
    if entry is None:
        tensors = (torch.empty(rows * k, dtype=torch.int8),
                   torch.empty(rows * (k // 32), dtype=torch.float32),
                   torch.empty(rows * (k // 16), dtype=torch.int32))
        entry = kept[rows, k] = ({name: t.data_ptr() for name, t in
                                  zip(("xq", "xs", "xsums"), tensors)}, tensors)
    return entry[0]


def gguf_repacked_linear(x: torch.Tensor, repacked: torch.Tensor, qtype: int,
                         bias: torch.Tensor | None, residual: torch.Tensor | None,
                         out_features: int) -> torch.Tensor:
    """gguf_linear over gguf_repack's weights, at every row count (gguf_repacked.c): the same
    int8 arithmetic, and a row's result does not depend on the rows beside it."""
    ops = LinearOperands(x, bias, residual, out_features)
    scratch = _activation_buffers(ops.rows, ops.k)
    status = library._library().gguf_repacked_linear_f32(
        **ops.args, repacked=repacked.data_ptr(), qtype=qtype,
        **scratch)
    if status != 0:
        raise ValueError(f"gguf_repacked_linear: GGUF type {qtype} with K={ops.k} is not "
                         "repacked (or this library does not repack)")
    return ops.y


def gguf_repacked_silu_mul(x: torch.Tensor, repacked: torch.Tensor, qtype: int,
                           gate_up_features: int) -> torch.Tensor:
    """silu(gate) * up [T, gate_up_features / 2] of a fused gate/up linear's repacked weights
    ([gate | up] rows) in one pass: the gate/up output never written whole, the same values
    as gguf_repacked_linear then silu_and_mul."""
    half = gate_up_features // 2
    ops = LinearOperands(x, None, None, half)
    scratch = _activation_buffers(ops.rows, ops.k)
    args = {name: ops.args[name] for name in ("x", "ldx", "y", "rows", "k", "num_threads")}
    status = library._library().gguf_repacked_silu_mul_f32(
        **args, n=gate_up_features, repacked=repacked.data_ptr(), qtype=qtype,
        **scratch)
    if status != 0:
        raise ValueError(f"gguf_repacked_silu_mul: GGUF type {qtype}, K={ops.k}, "
                         f"N={gate_up_features} does not run fused in this library")
    return ops.y


def gguf_linear(x: torch.Tensor, blocks: torch.Tensor, qtype: int, bias: torch.Tensor | None,
                residual: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [T, K] fp32 (rows may be strided) quantized inside the call per row and block of 32,
    times GGUF weight blocks as stored (uint8 [N, row bytes]; the types of gguf_blocks.py;
    their scales and minima read from the blocks) -> fp32 [T, out_features]; bias [N] and
    residual [T, N] (fp32, rows may be strided) added in the same pass. See gguf_gemm.c.
    From AMX_MIN_ROWS rows on a CPU with AMX, the blocks of GGUF_AMX_TYPES on AMX-BF16 tiles
    with x in bf16 instead (amx_gemm.c); otherwise from GGUF_DEQUANT_MIN_ROWS rows, x in
    fp32 times panels of the blocks dequantized to fp32 (_gguf_linear_panels)."""
    ops = LinearOperands(x, bias, residual, out_features)
    rows, k, y = ops.rows, ops.k, ops.y
    common = dict(**ops.args, blocks=blocks.data_ptr(), qtype=qtype)
    lib = library._library()
    if (rows >= AMX_MIN_ROWS and qtype in GGUF_AMX_TYPES and library.amx()
            and lib.gguf_linear_amx_f32(**common) == 0):
        return y
    if rows >= GGUF_DEQUANT_MIN_ROWS:
        return _gguf_linear_panels(ops.x, blocks, qtype, bias, ops.residual, y)
    scratch = _activation_buffers(rows, k)
    status = lib.gguf_linear_f32(**common, **scratch)
    if status != 0:
        raise ValueError(f"gguf_linear: GGUF type {qtype} with K={k} is not a block type the "
                         "kernel reads (blocks of 32; the K types' super-blocks of 256)")
    return y
