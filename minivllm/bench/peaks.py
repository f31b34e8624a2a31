"""This CPU's arithmetic peaks on all its threads, measured: each instruction in independent
register chains (10 of them, enough to cover the latencies on two pipes), compiled here
with cc -march=native, a multiply-add counted as two operations. What the GEMM benchmarks
state their fraction of (benchmarks/gemm_roof.py, benchmarks/int8_gemm.py).

- fp32 FMA on the widest vectors the CPU has (zmm with AVX-512, else ymm);
- bf16 dot products: vdpbf16ps on zmm (AVX512-BF16), 2 multiply-adds a lane;
- int8 VNNI: vpdpbusd (zmm with AVX512-VNNI, ymm with AVX-VNNI), 4 multiply-adds a lane;
- int8 AVX2: vpmaddubsw + vpmaddwd + vpaddd, the AVX2 kernels' mix for the same work.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile
from pathlib import Path

from minivllm.bench.timing import call_seconds, timed

PEAK_C = r"""
#include <immintrin.h>
#include <stdint.h>
#if defined(__AVX512F__)
#define VEC __m512
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define FIRST(v) _mm512_cvtss_f32(v)
int fma_lanes(void) { return 16; }
#else
#define VEC __m256
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define FIRST(v) _mm256_cvtss_f32(v)
int fma_lanes(void) { return 8; }
#endif
float fma_peak(int64_t iters) {
    float total = 0.f;
#pragma omp parallel reduction(+ : total)
    {
        VEC a[10], b = SET1(1e-9f), c = SET1(1.f);
        for (int i = 0; i < 10; i++) a[i] = SET1((float)i);
        for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 10
            for (int i = 0; i < 10; i++) a[i] = FMA(a[i], c, b);
        for (int i = 0; i < 10; i++) total += FIRST(a[i]);
    }
    return total;
}
int avx2_int8_peak(int64_t iters) {
    int total = 0;
#pragma omp parallel reduction(+ : total)
    {
        __m256i acc[10], w[10], x = _mm256_set1_epi8(3);
        const __m256i ones = _mm256_set1_epi16(1);
        for (int i = 0; i < 10; i++) acc[i] = _mm256_set1_epi32(i);
        for (int i = 0; i < 10; i++) w[i] = _mm256_set1_epi8((char)(i + 1));
        for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 10
            for (int i = 0; i < 10; i++) {
                __m256i p = _mm256_maddubs_epi16(w[i], x);
                acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(p, ones));
            }
            x = _mm256_add_epi8(x, ones);
        }
        for (int i = 0; i < 10; i++) total += _mm256_extract_epi32(acc[i], 0);
    }
    return total;
}
#if defined(__AVX512BF16__)
int bf16_lanes(void) { return 16; }
float bf16_peak(int64_t iters) {
    float total = 0.f;
#pragma omp parallel reduction(+ : total)
    {
        __m512 acc[10];
        const __m512bh w = (__m512bh)_mm512_set1_epi32(0x3f803f80), x = w; /* 1.0 pairs */
        for (int i = 0; i < 10; i++) acc[i] = _mm512_set1_ps((float)i);
        for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 10
            for (int i = 0; i < 10; i++) acc[i] = _mm512_dpbf16_ps(acc[i], w, x);
        for (int i = 0; i < 10; i++) total += _mm512_cvtss_f32(acc[i]);
    }
    return total;
}
#else
int bf16_lanes(void) { return 0; }
float bf16_peak(int64_t iters) { return (float)iters; }
#endif
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
#if defined(__AVX512VNNI__)
#define IVEC __m512i
#define ISET1 _mm512_set1_epi32
#define DPBUSD _mm512_dpbusd_epi32
#define IFIRST(v) _mm_cvtsi128_si32(_mm512_castsi512_si128(v))
int vnni_lanes(void) { return 16; }
#else
#define IVEC __m256i
#define ISET1 _mm256_set1_epi32
#define DPBUSD _mm256_dpbusd_avx_epi32
#define IFIRST(v) _mm256_extract_epi32(v, 0)
int vnni_lanes(void) { return 8; }
#endif
int vnni_peak(int64_t iters) {
    int total = 0;
#pragma omp parallel reduction(+ : total)
    {
        IVEC acc[10], w = ISET1(0x01020304), x = ISET1(0x03030303);
        for (int i = 0; i < 10; i++) acc[i] = ISET1(i);
        for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 10
            for (int i = 0; i < 10; i++) acc[i] = DPBUSD(acc[i], x, w);
        for (int i = 0; i < 10; i++) total += IFIRST(acc[i]);
    }
    return total;
}
#else
int vnni_lanes(void) { return 0; }
int vnni_peak(int64_t iters) { return (int)iters; }
#endif
"""


def measure_peaks(threads: int, iters: int = 20_000_000) -> dict[str, float]:
    """{"fp32": GFLOP/s, "int8_avx2": GOP/s, "int8_vnni": GOP/s (absent without VNNI),
    "bf16": GFLOP/s of bf16 dot products (absent without AVX512-BF16)}."""
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = Path(tmp) / "peak.c", Path(tmp) / "peak.so"
        src.write_text(PEAK_C)
        subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC",
                        str(src), "-o", str(lib)], check=True)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        peak = ctypes.CDLL(str(lib))
        for fn in (peak.fma_peak, peak.avx2_int8_peak, peak.vnni_peak, peak.bf16_peak):
            fn.argtypes = [ctypes.c_int64]
        peak.fma_peak.restype = peak.bf16_peak.restype = ctypes.c_float
        runs = {"fp32": (peak.fma_peak, 10 * peak.fma_lanes() * 2),
                "int8_avx2": (peak.avx2_int8_peak, 10 * 32 * 2)}
        if peak.vnni_lanes():
            runs["int8_vnni"] = (peak.vnni_peak, 10 * peak.vnni_lanes() * 4 * 2)
        if peak.bf16_lanes():
            runs["bf16"] = (peak.bf16_peak, 10 * peak.bf16_lanes() * 2 * 2)
        results = {}
        for name, (fn, ops) in runs.items():
            fn(iters // 10)  # warm up (and let the clock settle)
            results[name] = ops * iters * threads / timed(fn, iters)[1] / 1e9
    return results


def memory_bandwidth(threads: int, mib: int = 512) -> float:
    """Bytes/s of a large copy on `threads` threads (read + write counted), the best of 5."""
    import torch  # only here: the peaks above need none

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.ones(mib << 18)  # mib MiB of float32
        dst = torch.empty_like(src)
        seconds = min(call_seconds(lambda: dst.copy_(src), repeats=5))
    finally:
        torch.set_num_threads(saved)
    return 2 * src.numel() * 4 / seconds
