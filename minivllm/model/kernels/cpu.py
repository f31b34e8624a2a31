"""The C kernels (paged_attention.c, ops.c, sampler.c, int8_gemm.c), compiled with the
machine's C compiler on first use and loaded with ctypes: no torch headers, so the build
takes about a second, and the library is cached under ~/.cache/minivllm (or
$MINIVLLM_CACHE). Without a compiler, or when the build fails, `available()` is False and
the callers keep their pure-torch paths, which stay the tested references. fp32 CPU
tensors only."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from minivllm.model import kernels

logger = logging.getLogger(__name__)
_SOURCES = [Path(__file__).with_name(name)
            for name in ("paged_attention.c", "ops.c", "sampler.c", "int8_gemm.c")]
# Compile with -ffast-math (vectorized expf), but link without it: linking with it adds
# crtfastmath.o, which turns on flush-to-zero for the whole process at load time.
_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC"]
_LINK = ["-shared", "-fopenmp", "-lm"]
_P, _I, _I64, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    # the int after q, k_cache, v_cache: kv_bf16 (a bf16 K/V cache, else fp32)
    # ... and after scale: window, softcap (sliding-window layers, Gemma 2's logit cap)
    "paged_decode_attention_f32": [_P] * 3 + [_I] + [_P] * 3 + [_I] * 6 + [_I64, _F, _I, _F, _I],
    "paged_prefill_attention_f32": [_P] * 3 + [_I] + [_P] * 4 + [_I] * 6 + [_I64, _F, _I, _F, _I],
    "rms_norm_f32": [_P, _P, _P, _I64, _I, _F, _I],
    "silu_and_mul_f32": [_P, _P, _I64, _I, _I],
    "rope_write_kv_f32": [_P, _I64] + [_P] * 6 + [_I, _I64, _I, _I, _I, _I],
    "argmax_rows_f32": [_P, _P, _I64, _I64, _I],
    "sample_rows_f32": [_P, _I64, _I64] + [_P] * 10 + [_I],
    "sampler_uniforms_f64": [_P, _P, _P, _I64],
    "int8_linear_f32": [_P, _I64] + [_P] * 4 + [_I64] + [_P] * 4 + [_I64] + [_I] * 4,
}


def _run(cmd: list[str]) -> bool:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        logger.warning("building the C kernels failed, using torch: %s",
                       result.stderr.strip()[:500])
    return result.returncode == 0


def _build(compiler: str, target: Path) -> bool:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            objects = [str(Path(tmp) / f"{source.stem}.o") for source in _SOURCES]
            built = Path(tmp) / target.name
            if not all(_run([compiler, *_FLAGS, "-c", str(source), "-o", obj])
                       for source, obj in zip(_SOURCES, objects)):
                return False
            if not _run([compiler, *objects, *_LINK, "-o", str(built)]):
                return False
            os.replace(built, target)  # atomic: concurrent builders never see half a file
    except OSError as exc:  # e.g. a read-only cache directory
        logger.warning("cannot build the C kernels in %s, using torch: %s", target.parent, exc)
        return False
    return True


@cache
def _library() -> ctypes.CDLL | None:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        logger.warning("no C compiler found: using the pure-torch paths")
        return None
    key = hashlib.sha256(b"".join(s.read_bytes() for s in _SOURCES)
                         + " ".join([compiler, *_FLAGS, *_LINK]).encode())
    cache_root = os.environ.get("MINIVLLM_CACHE") or Path.home() / ".cache" / "minivllm"
    target = Path(cache_root) / "kernels" / f"minivllm-kernels-{key.hexdigest()[:16]}.so"
    if not target.exists() and not _build(compiler, target):
        return None
    lib = ctypes.CDLL(str(target))
    for name, argtypes in _SIGNATURES.items():
        getattr(lib, name).argtypes = argtypes
        getattr(lib, name).restype = None
    return lib


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernels can run on this device and dtype (building them if needed)."""
    return (device.type == "cpu" and dtype == torch.float32 and kernels.enabled()
            and _library() is not None)


KV_CACHE_DTYPES = (torch.float32, torch.bfloat16)  # what the attention kernels read


def _is_bf16(cache: torch.Tensor) -> int:
    return int(cache.dtype == torch.bfloat16)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, seq_lens: torch.Tensor,
                           scale: float, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """q: [B, H, D] (rows may be strided); caches: [num_blocks, block_size, KVH, D]
    (contiguous, fp32 or bf16); block_table: [B, max_blocks] and seq_lens: [B], int64 -> [B, H, D]."""
    num_seqs, num_heads, head_dim = q.shape
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        q = q.contiguous()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _, block_size, num_kv_heads, _ = k_cache.shape
    _library().paged_decode_attention_f32(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), _is_bf16(k_cache),
        block_table.data_ptr(),
        seq_lens.data_ptr(), out.data_ptr(), num_seqs, num_heads, num_kv_heads, head_dim,
        block_size, block_table.shape[1], q.stride(0), scale, window, softcap,
        torch.get_num_threads())
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, hidden] contiguous."""
    out = torch.empty_like(x)
    _library().rms_norm_f32(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0],
                            x.shape[1], eps, torch.get_num_threads())
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2 * n] = [gate | up] contiguous -> silu(gate) * up, [T, n]."""
    out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device=x.device)
    _library().silu_and_mul_f32(x.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1] // 2,
                                torch.get_num_threads())
    return out


def rope_write_kv(qkv: torch.Tensor, positions: torch.Tensor,
                  cos_sin: tuple[torch.Tensor, torch.Tensor], slot_mapping: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int,
                  num_kv_heads: int, head_dim: int) -> None:
    """Rotates q and k in place in qkv [T, (H + 2 KVH) * D] (contiguous rows) and writes k
    and v at their slots. cos_sin: the full [max_positions, D] tables (see rope.py)."""
    cos, signed_sin = cos_sin
    _library().rope_write_kv_f32(
        qkv.data_ptr(), qkv.stride(0), positions.data_ptr(), cos.data_ptr(),
        signed_sin.data_ptr(), slot_mapping.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        _is_bf16(k_cache), qkv.shape[0], num_heads, num_kv_heads, head_dim,
        torch.get_num_threads())


def argmax(x: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax of x [N, V] (contiguous), first index on ties -> [N] int64."""
    out = torch.empty(x.shape[0], dtype=torch.long)
    _library().argmax_rows_f32(x.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1],
                               torch.get_num_threads())
    return out


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_table: torch.Tensor, query_start_loc: torch.Tensor,
                            seq_lens: torch.Tensor, scale: float, window: int = 0,
                            softcap: float = 0.0) -> torch.Tensor:
    """Causal attention of P requests' new tokens over their paged contexts, read in place.

    q: [T, H, D], the new tokens of the P requests concatenated (rows may be strided);
    caches: [num_blocks, block_size, KVH, D] (contiguous, one layer, fp32 or bf16); block_table:
    [P, max_blocks] (padded rows); query_start_loc: [P + 1] from 0 to T; seq_lens: [P],
    each request's context length after this step; all int64. Request p's queries are its
    last query_len positions: query i sits at position seq_lens[p] - query_len + i and
    sees positions 0..that one. H is a multiple of KVH (GQA). Returns [T, H, D]."""
    _, num_heads, head_dim = q.shape
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        q = q.contiguous()
    block_table, query_start_loc, seq_lens = (
        t.contiguous() for t in (block_table, query_start_loc, seq_lens))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _, block_size, num_kv_heads, _ = k_cache.shape
    _library().paged_prefill_attention_f32(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), _is_bf16(k_cache),
        block_table.data_ptr(),
        query_start_loc.data_ptr(), seq_lens.data_ptr(), out.data_ptr(), seq_lens.shape[0],
        num_heads, num_kv_heads, head_dim, block_size, block_table.shape[1], q.stride(0),
        scale, window, softcap, torch.get_num_threads())
    return out


def sample_rows(logits: torch.Tensor, fparams: torch.Tensor, iparams: torch.Tensor,
                seen: tuple, penalties: tuple, bans: tuple) -> torch.Tensor:
    """One token per row of logits [N, V] (contiguous fp32): see sampler.c's sample_rows_f32
    and minivllm/model/sampler.py. seen = (offsets, ids), penalties = (offsets, ids, deltas),
    bans = (offsets, ids): numpy arrays (int64 offsets, int32 ids, fp32 deltas). The logits
    are penalized in place during the call and restored, value for value."""
    out = torch.empty(logits.shape[0], dtype=torch.long)
    arrays = (*seen, *penalties, *bans)
    _library().sample_rows_f32(logits.data_ptr(), logits.shape[0], logits.shape[1],
                               fparams.data_ptr(), iparams.data_ptr(),
                               *(a.ctypes.data for a in arrays), out.data_ptr(),
                               torch.get_num_threads())
    return out


def sampler_uniforms(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The sampler's uniform for each (key, position), both int64 [N] -> float64 [N]."""
    out = torch.empty(keys.shape[0], dtype=torch.float64)
    _library().sampler_uniforms_f64(keys.data_ptr(), positions.data_ptr(), out.data_ptr(),
                                    keys.shape[0])
    return out


def int8_linear(x: torch.Tensor, packed: torch.Tensor, w_scales: torch.Tensor,
                bias: torch.Tensor | None, residual: torch.Tensor | None,
                out_features: int) -> torch.Tensor:
    """W8A8: x [T, K] fp32 (rows may be strided) quantized per row inside the call, times
    int8 weights packed by linear_int8.pack_weight, scaled back to fp32 [T, out_features];
    bias [N] and residual [T, N] (fp32) added in the same pass. See int8_gemm.c."""
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, k = x.shape
    kp = -(-k // 32) * 32
    y = torch.empty(rows, out_features, dtype=torch.float32)
    scratch = torch.empty(rows * kp, dtype=torch.int8)
    x_scales = torch.empty(rows, dtype=torch.float32)
    x_sums = torch.empty(rows, dtype=torch.int32)
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()
    _library().int8_linear_f32(
        x.data_ptr(), x.stride(0), packed.data_ptr(), w_scales.data_ptr(),
        None if bias is None else bias.data_ptr(),
        None if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0), y.data_ptr(), scratch.data_ptr(),
        x_scales.data_ptr(), x_sums.data_ptr(), rows, k, kp, out_features,
        torch.get_num_threads())
    return y
