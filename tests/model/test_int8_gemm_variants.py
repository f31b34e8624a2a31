"""Every variant of int8_gemm.c this machine can run, each compiled on its own with exactly
its instruction set's flags (as build.py builds one library per ISA level), against the
torch reference: AVX512-VNNI (vpdpbusd on 512 bits), AVX-VNNI (256 bits), AVX2 (vpmaddubsw
with the sign trick) and plain C. A variant the CPU or the compiler lacks is skipped, saying
which; the library the engine loads is tested in test_quantization.py."""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from minivllm.model.linear.int8 import (
    GROUP,
    pack_scales,
    pack_weight,
    quantize_weight,
    reference_int8_linear,
)

SOURCE = Path(__file__).resolve().parents[2] / "minivllm" / "model" / "kernels" / "int8_gemm.c"
_AVX2 = ["-mavx2", "-mfma"]
_AVX512 = [*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl"]
# variant: (the /proc/cpuinfo flags it needs, its compiler flags, an instruction only it has)
VARIANTS = {
    "generic": ((), [], None),
    "avx2": (("avx2", "fma"), _AVX2, "vpmaddubsw"),
    "avx_vnni": (("avx2", "fma", "avx_vnni"), [*_AVX2, "-mavxvnni"], "vpdpbusd"),
    "avx512_vnni": (("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
                    [*_AVX512, "-mavx512vnni"], "vpdpbusd"),
}


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next((set(line.partition(":")[2].split()) for line in text.splitlines()
                 if line.startswith("flags")), set())


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory):
    """The variant's library, compiled as build.py would, with exactly its flags."""
    name = request.param
    needs, flags, instruction = VARIANTS[name]
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    missing = [f for f in needs if f not in _cpu_flags()]
    if missing:
        pytest.skip(f"this CPU lacks {' '.join(missing)}: the {name} variant cannot run here")
    # The compiler's x86-64 baseline, whatever its default (some assume x86-64-v3).
    base = ["-march=x86-64"] if platform.machine() in ("x86_64", "AMD64") else []
    out = tmp_path_factory.mktemp(name)
    lib = out / "int8_gemm.so"
    # Compiled with -ffast-math but linked without it, as build.py does: linked with it,
    # crtfastmath.o would turn on flush-to-zero in this whole test process.
    built = subprocess.run([compiler, "-O3", "-ffast-math", "-fopenmp", "-fPIC", "-c",
                            *base, *flags, str(SOURCE), "-o", str(out / "int8_gemm.o")],
                           capture_output=True, text=True)
    if built.returncode != 0 and "unrecognized" in built.stderr:
        pytest.skip(f"{compiler} does not know {name}'s flags: {built.stderr.strip()}")
    assert built.returncode == 0, built.stderr
    linked = subprocess.run([compiler, "-shared", "-fopenmp", str(out / "int8_gemm.o"), "-o",
                             str(lib), "-lm"], capture_output=True, text=True)
    assert linked.returncode == 0, linked.stderr
    objdump = shutil.which("objdump")
    if instruction and objdump:  # the macros picked the variant asked for
        assert instruction in subprocess.run([objdump, "-d", str(lib)], capture_output=True,
                                             text=True).stdout
    fn = ctypes.CDLL(str(lib)).int8_linear_f32
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    fn.argtypes = [p, i64, p, p, p, p, i64, p, p, p, p, i64, i32, i32, i32, i32]
    fn.restype = None
    return fn


def _run(fn, x, packed, scales, bias, residual, n, threads):
    rows, k = x.shape
    kp = -(-k // 32) * 32
    y = torch.empty(rows, n)
    scratch = torch.empty(rows * kp, dtype=torch.int8)
    gscales = torch.empty(rows * kp // GROUP)
    gsums = torch.empty(rows * kp // GROUP, dtype=torch.int32)
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    fn(ptr(x), x.stride(0), ptr(packed), ptr(scales), ptr(bias), ptr(residual),
       0 if residual is None else residual.stride(0), ptr(y), ptr(scratch),
       ptr(gscales), ptr(gsums), rows, k, kp, n, threads)
    return y


@pytest.mark.parametrize("rows, n, k", [(1, 960, 576), (9, 576, 1536), (100, 3072, 576),
                                        (8, 49152, 576), (13, 37, 100), (3, 5, 7),
                                        (11, 48, 64), (7, 80, 32)])
@pytest.mark.parametrize("threads", [1, 2])
def test_variant_matches_torch_reference(variant, rows, n, k, threads):
    """SmolLM2's shapes (qkv, down, gate_up, the LM head) and odd tiny ones, every tile tail
    (1..8 rows: AVX-512's tiles of 6, AVX2's of 3, the generic 4), an odd panel count (the
    AVX-512 tiles take two panels side by side), one and two threads; bias and residual."""
    gen = torch.Generator().manual_seed(rows * n + k)
    weight = torch.randn(n, k, generator=gen) * 0.05
    x = torch.randn(rows, k, generator=gen)
    x[0, 3] = 40.0  # an outlier channel
    bias, residual = torch.randn(n, generator=gen), torch.randn(rows, n, generator=gen)
    weight[:, 64:96] *= 10  # a group of larger weights
    q, scales = quantize_weight(weight)
    packed, packed_scales = pack_weight(q), pack_scales(scales)
    expected = reference_int8_linear(x, q, scales)
    got = _run(variant, x, packed, packed_scales, bias, residual, n, threads)
    torch.testing.assert_close(got, expected + bias + residual, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(_run(variant, x, packed, packed_scales, None, None, n, threads),
                               expected, rtol=1e-5, atol=1e-5)
