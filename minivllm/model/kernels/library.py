"""The C kernels' library, and the questions the torch-facing wrappers (*_ops.py) and the
model ask of it: built and loaded by build.py on first use, for this CPU's ISA level
(isa.py), called with keyword arguments named as in kernels.h (declarations.py binds
them). `_kernels()` decides whether they run: not with MINIVLLM_DISABLE_KERNELS, nor
without a compiler, or when the build or the load fails; then `available()` is False and
the callers keep their pure-torch paths, which stay the tested references. fp32 CPU
tensors only.

The wrappers call `library._library()` at call time, an attribute of this module: a test
that points it at another library (another ISA level, a recording one) reaches them all."""

from __future__ import annotations

import os
from functools import cache
from types import SimpleNamespace

import torch

from minivllm.model.kernels import build


def enabled() -> bool:
    """False with MINIVLLM_DISABLE_KERNELS set: every kernel off, the pure-torch paths run
    everywhere."""
    return not os.environ.get("MINIVLLM_DISABLE_KERNELS")


@cache
def _library() -> SimpleNamespace | None:
    return build.load()


def _kernels() -> SimpleNamespace | None:
    """The library, or None where the torch paths run (turned off, or not to be had). The
    variant questions below (amx(), panel_width()...) ask _library(): they are asked on
    the kernels' own paths, chosen when the model was built."""
    return _library() if enabled() else None


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernels can run on this device and dtype (building them if needed)."""
    return device.type == "cpu" and dtype == torch.float32 and _kernels() is not None


def isa_summary() -> str | None:
    """Which ISA level's kernels run and what they were compiled for (the start-up line's
    words), or None when the torch paths run."""
    lib = _kernels()
    return lib.isa_summary if lib is not None else None


def amx() -> bool:
    """Whether the AMX-BF16 tiles run (amx_gemm.c): the library was built for the amx level
    (MINIVLLM_ISA=avx512_bf16 turns it off) and Linux hands this process the tiles (a probe
    product, once per library). Then bf16 linears run there at any batch, and int8_linear
    and gguf_linear run batches of linear_ops.AMX_MIN_ROWS rows and more there."""
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


def bf16_prefill_products() -> bool:
    """Whether a bf16 cache's prefill attention multiplies in bf16 (q and the probabilities
    rounded): on AMX tiles where amx(), else on AVX-512 BF16 pair dots where the library
    was built with them; below those, fp32 math over the widened cache."""
    lib = _library()
    return lib is not None and (amx() or "avx512_bf16" in lib.isa_features)


def panel_width() -> int:
    """The columns of panel_gemm.c's panels (linear/panels.py's pack_weight), or 0 where it
    does not run (no kernels, or a library below AVX2)."""
    lib = _library()
    return lib.panel_width() if lib is not None else 0


def panel_bf16_dot() -> bool:
    """Whether panel_gemm.c runs bf16 dot products here (the "bf16 pairs" layout: a library
    at AVX512-BF16 or above)."""
    lib = _library()
    return lib is not None and bool(lib.panel_bf16_dot())


def gguf_repacked() -> bool:
    """Whether this CPU's library runs GGUF weights repacked into panels of 16 columns
    (gguf_repack.c, gguf_repacked.c: AVX2 and AVX-512 VNNI)."""
    return bool(_library().gguf_repacked_supported())


def gguf_repacked_silu_mul_supported() -> bool:
    """Whether gguf_ops.gguf_repacked_silu_mul runs in this CPU's library (AVX-512 VNNI: its
    tiles hold two panels, a gate's and the matching up's)."""
    return bool(_library().gguf_repacked_silu_mul_supported())
