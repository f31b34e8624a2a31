"""The C kernels (the .c files beside this one) behind torch-facing wrappers: built and
loaded by build.py on first use, for this CPU's ISA level (isa.py), called with keyword
arguments named as in kernels.h (declarations.py binds them). `_kernels()` decides whether
they run: not with MINIVLLM_DISABLE_KERNELS, nor without a compiler, or when the build or
the load fails; then `available()` is False and the callers keep their pure-torch paths,
which stay the tested references. fp32 CPU tensors only."""

from __future__ import annotations

import threading
from functools import cache
from types import SimpleNamespace

import torch

from minivllm.model import kernels
from minivllm.model.kernels import build
from minivllm.model.kv_quant import QuantizedKV


@cache
def _library() -> SimpleNamespace | None:
    return build.load()


def _kernels() -> SimpleNamespace | None:
    """The library, or None where the torch paths run (turned off, or not to be had). The
    variant questions below (amx(), panel_width()...) ask _library(): they are asked on
    the kernels' own paths, chosen when the model was built."""
    return _library() if kernels.enabled() else None


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernels can run on this device and dtype (building them if needed)."""
    return device.type == "cpu" and dtype == torch.float32 and _kernels() is not None


def isa_summary() -> str | None:
    """Which ISA level's kernels run and what they were compiled for (the start-up line's
    words), or None when the torch paths run."""
    lib = _kernels()
    return lib.isa_summary if lib is not None else None


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
    _library().paged_decode_attention_f32(
        q=q.data_ptr(), **_kv_args(k_cache, v_cache), block_table=block_table.data_ptr(),
        seq_lens=seq_lens.data_ptr(), out=out.data_ptr(), num_seqs=num_seqs,
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        block_size=block_size, max_blocks=block_table.shape[1], q_stride=q.stride(0),
        scale=scale, window=window, softcap=softcap, num_threads=torch.get_num_threads())
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, hidden], any strides (a per-head q/k norm gets a strided view of qkv)."""
    # The kernel reads and writes dense rows; empty_like would copy a view's strides.
    x = x.contiguous()
    out = torch.empty_like(x)
    _library().rms_norm_f32(x=x.data_ptr(), weight=weight.data_ptr(), out=out.data_ptr(),
                            rows=x.shape[0], cols=x.shape[1], eps=eps,
                            num_threads=torch.get_num_threads())
    return out


def lora_sgmv(x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, seg: torch.Tensor,
              a: torch.Tensor, b: torch.Tensor, bounds: torch.Tensor) -> None:
    """y[rows[i]] += (x[rows[i]] @ a[s].T) @ B[s] in place, for each row i of segment s
    (rows[seg[s]:seg[s + 1]]): lora_sgmv.c. x [T, k] and y [T, n] fp32 with dense rows (any
    row stride); a [S, r, k] and b [S, r / slots, n] contiguous, both fp32 or both bf16: B[s]
    is block-diagonal, slot t's ranks (r / slots of them) feeding its columns bounds[t] to
    bounds[t + 1] (int64, slots + 1 of them, the last n), and b[s] holds its blocks side by
    side. rows and seg int64."""
    x = x if x.stride(1) == 1 else x.contiguous()
    h = torch.empty(rows.shape[0], a.shape[1])
    kernel = _library().lora_sgmv_bf16w if a.dtype == torch.bfloat16 else \
        _library().lora_sgmv_f32
    kernel(x=x.data_ptr(), ldx=x.stride(0), y=y.data_ptr(), ldy=y.stride(0),
           rows=rows.data_ptr(), seg=seg.data_ptr(), segments=a.shape[0], a=a.data_ptr(),
           b=b.data_ptr(), bounds=bounds.data_ptr(), slots=bounds.shape[0] - 1,
           h=h.data_ptr(), k=a.shape[2], r=a.shape[1], n=b.shape[2],
           num_threads=torch.get_num_threads())


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2 * n] = [gate | up] contiguous -> silu(gate) * up, [T, n]."""
    out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device=x.device)
    _library().silu_and_mul_f32(x=x.data_ptr(), out=out.data_ptr(), rows=x.shape[0],
                                half=x.shape[1] // 2, num_threads=torch.get_num_threads())
    return out


def rope_write_kv(qkv: torch.Tensor, positions: torch.Tensor,
                  cos_sin: tuple[torch.Tensor, torch.Tensor], slot_mapping: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int,
                  num_kv_heads: int, head_dim: int) -> None:
    """Rotates q and k in place in qkv [T, (H + 2 KVH) * D] (contiguous rows) and writes k
    and v at their slots (a QuantizedKV's quantized as kv_quant.quantize does). cos_sin: the
    full [max_positions, D] tables (see rope.py)."""
    cos, signed_sin = cos_sin
    _library().rope_write_kv_f32(
        qkv=qkv.data_ptr(), row_stride=qkv.stride(0), positions=positions.data_ptr(),
        cos=cos.data_ptr(), signed_sin=signed_sin.data_ptr(), slots=slot_mapping.data_ptr(),
        **_kv_args(k_cache, v_cache), tokens=qkv.shape[0], num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, num_threads=torch.get_num_threads())


def argmax(x: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax of x [N, V] (contiguous), first index on ties -> [N] int64."""
    out = torch.empty(x.shape[0], dtype=torch.long)
    _library().argmax_rows_f32(x=x.data_ptr(), out=out.data_ptr(), rows=x.shape[0],
                               cols=x.shape[1], num_threads=torch.get_num_threads())
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
    A bf16 cache without window and softcap runs on AMX tiles where amx() (amx_attention.c),
    else on AVX-512 BF16 pair dots where the library has them (dpbf16_attention.c): both
    round q and the probabilities to bf16 for the products. bf16_products=False: the
    fp32-math kernel whatever the cache (the reference the benchmarks and tests hold them to)."""
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
        if amx() and _library().paged_prefill_attention_amx(**args) == 0:
            return out
        if _library().paged_prefill_attention_dpbf16(**args) == 0:
            return out
    _library().paged_prefill_attention_f32(
        q=q.data_ptr(), **_kv_args(k_cache, v_cache), block_table=block_table.data_ptr(),
        query_start_loc=query_start_loc.data_ptr(), seq_lens=seq_lens.data_ptr(),
        out=out.data_ptr(), num_reqs=seq_lens.shape[0], num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
        max_blocks=block_table.shape[1], q_stride=q.stride(0), scale=scale, window=window,
        softcap=softcap, num_threads=torch.get_num_threads())
    return out


def sample_rows(logits: torch.Tensor, fparams: torch.Tensor, iparams: torch.Tensor,
                seen: tuple, penalties: tuple, bans: tuple) -> torch.Tensor:
    """One token per row of logits [N, V] (contiguous fp32): see sampler.c's sample_rows_f32
    and minivllm/model/sampler.py. seen = (offsets, ids), penalties = (offsets, ids, deltas),
    bans = (offsets, ids): numpy arrays (int64 offsets, int32 ids, fp32 deltas). The logits
    are penalized in place during the call and restored, value for value."""
    out = torch.empty(logits.shape[0], dtype=torch.long)
    (seen_off, seen_ids), (pen_off, pen_ids, pen_deltas), (ban_off, ban_ids) = (
        seen, penalties, bans)
    _library().sample_rows_f32(
        logits=logits.data_ptr(), rows=logits.shape[0], vocab=logits.shape[1],
        fparams=fparams.data_ptr(), iparams=iparams.data_ptr(),
        seen_off=seen_off.ctypes.data, seen_ids=seen_ids.ctypes.data,
        pen_off=pen_off.ctypes.data, pen_ids=pen_ids.ctypes.data,
        pen_deltas=pen_deltas.ctypes.data, ban_off=ban_off.ctypes.data,
        ban_ids=ban_ids.ctypes.data, out=out.data_ptr(), num_threads=torch.get_num_threads())
    return out


def sampler_uniforms(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The sampler's uniform for each (key, position), both int64 [N] -> float64 [N]."""
    out = torch.empty(keys.shape[0], dtype=torch.float64)
    _library().sampler_uniforms_f64(keys=keys.data_ptr(), positions=positions.data_ptr(),
                                    out=out.data_ptr(), n=keys.shape[0])
    return out


def bf16_prefill_products() -> bool:
    """Whether a bf16 cache's prefill attention multiplies in bf16 (q and the probabilities
    rounded): on AMX tiles where amx(), else on AVX-512 BF16 pair dots where the library
    was built with them; below those, fp32 math over the widened cache."""
    lib = _library()
    return lib is not None and (amx() or "avx512_bf16" in lib.isa_features)


def amx() -> bool:
    """Whether the AMX-BF16 tiles run (amx_gemm.c): the library was built for the amx level
    (MINIVLLM_ISA=avx512_bf16 turns it off) and Linux hands this process the tiles (a probe
    product, once per library). Then bf16 linears run there at any batch, and int8_linear
    and gguf_linear run batches of AMX_MIN_ROWS rows and more there."""
    lib = _library()
    if lib is None or "amx_bf16" not in lib.isa_features:
        return False
    if not hasattr(lib, "amx_runs"):
        x, y = torch.zeros(1, 32), torch.empty(1, 16)
        w = torch.zeros(16 * 32, dtype=torch.bfloat16)
        lib.amx_runs = lib.bf16_linear_amx_f32(
            x=x.data_ptr(), ldx=32, w=w.data_ptr(), bias=None, residual=None, ldr=0,
            y=y.data_ptr(), rows=1, k=32, kp=32, n=16, num_threads=1) == 0
    return lib.amx_runs


AMX_MIN_ROWS = 32  # from here on a batch is worth unpacking the weights to bf16 tiles for


class LinearOperands:
    """What every linear kernel takes around its weights: x [T, K] and residual [T, N] with
    unit column stride (copied if not; rows may be strided), a fresh fp32 y [T, N], and
    their arguments (`args`). Holding it keeps any copy alive through the call."""

    def __init__(self, x: torch.Tensor, bias: torch.Tensor | None,
                 residual: torch.Tensor | None, out_features: int) -> None:
        self.x = x if x.stride(1) == 1 else x.contiguous()
        self.residual = (residual.contiguous() if residual is not None
                         and residual.stride(1) != 1 else residual)
        self.rows, self.k = self.x.shape
        self.y = torch.empty(self.rows, out_features, dtype=torch.float32)
        self.args = dict(
            x=self.x.data_ptr(), ldx=self.x.stride(0),
            bias=None if bias is None else bias.data_ptr(),
            residual=None if self.residual is None else self.residual.data_ptr(),
            ldr=0 if self.residual is None else self.residual.stride(0), y=self.y.data_ptr(),
            rows=self.rows, k=self.k, n=out_features, num_threads=torch.get_num_threads())


def int8_linear(x: torch.Tensor, packed: torch.Tensor, w_scales: torch.Tensor,
                bias: torch.Tensor | None, residual: torch.Tensor | None,
                out_features: int, group: int) -> torch.Tensor:
    """W8A8: x [T, K] fp32 (rows may be strided) quantized inside the call, per row and group
    of `group` values, times int8 weights and their group scales packed by
    linear_int8.pack_weight, scaled back to fp32 [T, out_features]; bias [N] and residual
    [T, N] (fp32) added in the same pass. See int8_gemm.c. From AMX_MIN_ROWS rows on a CPU
    with AMX, the same weights on AMX-BF16 tiles with x in bf16 instead (amx_gemm.c)."""
    ops = LinearOperands(x, bias, residual, out_features)
    rows, kp = ops.rows, -(-ops.k // 32) * 32
    common = dict(**ops.args, w=packed.data_ptr(), w_scales=w_scales.data_ptr(), kp=kp)
    if rows >= AMX_MIN_ROWS and amx() and _library().int8_linear_amx_f32(**common) == 0:
        return ops.y
    scratch = torch.empty(rows * kp, dtype=torch.int8)
    gscales = torch.empty(rows * (kp // group), dtype=torch.float32)
    gsums = torch.empty(rows * (kp // group), dtype=torch.int32)
    _library().int8_linear_f32(**common, scratch=scratch.data_ptr(),
                               gscales=gscales.data_ptr(), gsums=gsums.data_ptr())
    return ops.y


def bf16_linear_amx(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                    residual: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [T, K] fp32 (rows may be strided) times bf16 weights packed by
    linear_amx.pack_weight, on AMX-BF16 tiles -> fp32 [T, out_features]; bias [N] and
    residual [T, N] (fp32) added in the same pass. See amx_gemm.c; only where amx()."""
    ops = LinearOperands(x, bias, residual, out_features)
    status = _library().bf16_linear_amx_f32(**ops.args, w=packed.data_ptr(),
                                            kp=packed.shape[1] * 2)
    if status != 0:
        raise RuntimeError("bf16_linear_amx: the AMX tiles could not be used (Linux refused "
                           "them, or memory ran out)")
    return ops.y


# kernels.h's PANEL_STORED_* codes: fp32 and bf16 weights (fp32 arithmetic), bf16 pairs (bf16
# dot products)
PANEL_STORED = {"fp32": 0, "bf16": 1, "bf16 pairs": 2}


def panel_width() -> int:
    """The columns of panel_gemm.c's panels (linear_panels.pack_weight), or 0 where it does
    not run (no kernels, or a library below AVX2)."""
    lib = _library()
    return lib.panel_width() if lib is not None else 0


def panel_bf16_dot() -> bool:
    """Whether panel_gemm.c runs bf16 dot products here (the "bf16 pairs" layout: a library
    at AVX512-BF16 or above)."""
    lib = _library()
    return lib is not None and bool(lib.panel_bf16_dot())


def panel_linear(x: torch.Tensor, packed: torch.Tensor, stored: str, bias: torch.Tensor | None,
                 residual: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [T, K] fp32 (rows may be strided) times weights packed by linear_panels.pack_weight
    as `stored` (PANEL_STORED's names) -> fp32 [T, out_features]; bias [N] and residual
    [T, N] (fp32) added in the same pass. See panel_gemm.c; only where panel_width() (and
    for "bf16 pairs" panel_bf16_dot())."""
    ops = LinearOperands(x, bias, residual, out_features)
    status = _library().panel_linear_f32(**ops.args, w=packed.data_ptr(),
                                         stored=PANEL_STORED[stored])
    if status == -2:
        raise MemoryError("panel_linear: no memory for x in bf16")
    if status != 0:
        raise RuntimeError(f"panel_linear: this library has no panel kernel for {stored} "
                           "weights")
    return ops.y


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
    status = _library().gguf_dequantize_f32(blocks=blocks.data_ptr(), qtype=qtype, k=k,
                                            n0=start, n1=end, out=out.data_ptr(),
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


def gguf_repacked() -> bool:
    """Whether this CPU's library runs GGUF weights repacked into panels of 16 columns
    (gguf_repack.c, gguf_repacked.c: AVX2 and AVX-512 VNNI)."""
    return bool(_library().gguf_repacked_supported())


def gguf_repack(blocks: torch.Tensor, qtype: int, k: int) -> torch.Tensor | None:
    """GGUF blocks (uint8 [N, row bytes]) repacked for gguf_repacked_linear (uint8, the file's
    bytes per weight), or None where not repacked (another type, or not this CPU)."""
    n = blocks.shape[0]
    size = _library().gguf_repacked_bytes(qtype=qtype, k=k, n=n)
    if not size or not gguf_repacked():
        return None
    repacked = torch.empty(size, dtype=torch.uint8)
    _library().gguf_repack(blocks=blocks.contiguous().data_ptr(), qtype=qtype, k=k, n=n,
                           repacked=repacked.data_ptr(), num_threads=torch.get_num_threads())
    return repacked


def _activation_buffers(rows: int, k: int) -> dict[str, torch.Tensor]:
    """Scratch for x quantized per row and block of 32 (gguf_activations.h)."""
    return {"xq": torch.empty(rows * k, dtype=torch.int8),
            "xs": torch.empty(rows * (k // 32), dtype=torch.float32),
            "xsums": torch.empty(rows * (k // 16), dtype=torch.int32)}


def gguf_repacked_linear(x: torch.Tensor, repacked: torch.Tensor, qtype: int,
                         bias: torch.Tensor | None, residual: torch.Tensor | None,
                         out_features: int) -> torch.Tensor:
    """gguf_linear over gguf_repack's weights, at every row count (gguf_repacked.c): the same
    int8 arithmetic, and a row's result does not depend on the rows beside it."""
    ops = LinearOperands(x, bias, residual, out_features)
    scratch = _activation_buffers(ops.rows, ops.k)
    status = _library().gguf_repacked_linear_f32(
        **ops.args, repacked=repacked.data_ptr(), qtype=qtype,
        **{name: t.data_ptr() for name, t in scratch.items()})
    if status != 0:
        raise ValueError(f"gguf_repacked_linear: GGUF type {qtype} with K={ops.k} is not "
                         "repacked (or this library does not repack)")
    return ops.y


def gguf_repacked_silu_mul_supported() -> bool:
    """Whether gguf_repacked_silu_mul runs in this CPU's library (AVX-512 VNNI: its tiles
    hold two panels, a gate's and the matching up's)."""
    return bool(_library().gguf_repacked_silu_mul_supported())


def gguf_repacked_silu_mul(x: torch.Tensor, repacked: torch.Tensor, qtype: int,
                           gate_up_features: int) -> torch.Tensor:
    """silu(gate) * up [T, gate_up_features / 2] of a fused gate/up linear's repacked weights
    ([gate | up] rows) in one pass: the gate/up output never written whole, the same values
    as gguf_repacked_linear then silu_and_mul."""
    half = gate_up_features // 2
    ops = LinearOperands(x, None, None, half)
    scratch = _activation_buffers(ops.rows, ops.k)
    args = {name: ops.args[name] for name in ("x", "ldx", "y", "rows", "k", "num_threads")}
    status = _library().gguf_repacked_silu_mul_f32(
        **args, n=gate_up_features, repacked=repacked.data_ptr(), qtype=qtype,
        **{name: t.data_ptr() for name, t in scratch.items()})
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
    if (rows >= AMX_MIN_ROWS and qtype in GGUF_AMX_TYPES and amx()
            and _library().gguf_linear_amx_f32(**common) == 0):
        return y
    if rows >= GGUF_DEQUANT_MIN_ROWS:
        return _gguf_linear_panels(ops.x, blocks, qtype, bias, ops.residual, y)
    scratch = _activation_buffers(rows, k)
    status = _library().gguf_linear_f32(**common,
                                        **{name: t.data_ptr() for name, t in scratch.items()})
    if status != 0:
        raise ValueError(f"gguf_linear: GGUF type {qtype} with K={k} is not a block type the "
                         "kernel reads (blocks of 32; the K types' super-blocks of 256)")
    return y
