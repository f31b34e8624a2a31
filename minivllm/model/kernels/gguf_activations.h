/* GGUF kernels' activations (gguf_gemm.c, gguf_repacked.c): x quantized per row and block of
 * 32 to int8, llama.cpp's q8_0 activations with each half's sum (its q8_1). Both kernels
 * quantize the same way, so a row's int8 values never depend on which kernel runs it. */
#ifndef MINIVLLM_GGUF_ACTIVATIONS_H
#define MINIVLLM_GGUF_ACTIVATIONS_H

#include <math.h>
#include <stdint.h>

#include "gguf_unpack.h"

/* One block of BLOCK = 32 values, symmetric int8: q = nearbyint(x * (127 / max|x|)), scale
 * max|x| / 127 (1 for an all-zero block), and each half's sum of q. The same fp32 operations
 * as linear/gguf.py's quantize_blocks whatever the variant: a max (exact in any order), one
 * division, a product per value and a conversion in the default round-to-nearest-even mode
 * (vcvtps2dq, as nearbyintf). Vectorized because it runs on every linear's input: scalar, it
 * was ~4 ns a value per thread, a fifth of a Qwen2.5-0.5B prefill. */
#define EXACT_FP __attribute__((optimize("no-fast-math")))
#if defined(__AVX512F__)
#include <immintrin.h>

EXACT_FP static inline void quantize_block(const float *x, int8_t *q, float *scale,
                                           int32_t sum[2]) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    *scale = amax > 0.f ? amax / 127.f : 1.f;
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, inv));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, inv));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(q1));
    sum[0] = _mm512_reduce_add_epi32(q0);
    sum[1] = _mm512_reduce_add_epi32(q1);
}

#elif defined(__AVX2__)
#include <immintrin.h>

static inline float max8(__m256 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}

static inline int32_t sum8(__m256i v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1)));
}

EXACT_FP static inline void quantize_block(const float *x, int8_t *q, float *scale,
                                           int32_t sum[2]) {
    const __m256 no_sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(m, _mm256_and_ps(v[i], no_sign));
    }
    const float amax = max8(m);
    const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    *scale = amax > 0.f ? amax / 127.f : 1.f;
    __m256i qi[4];
    for (int i = 0; i < 4; i++) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
    /* int32 -> int8 (|q| <= 127: no saturation); the packs interleave 128-bit lanes, the
     * permutation puts the four 8-byte runs back in order */
    const __m256i bytes = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3])),
        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, bytes);
    sum[0] = sum8(_mm256_add_epi32(qi[0], qi[1]));
    sum[1] = sum8(_mm256_add_epi32(qi[2], qi[3]));
}

#else
#include <math.h>

EXACT_FP static inline void quantize_block(const float *x, int8_t *q, float *scale,
                                           int32_t sum[2]) {
    float amax = 0.f;
    for (int i = 0; i < BLOCK; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    *scale = amax > 0.f ? amax / 127.f : 1.f;
    sum[0] = sum[1] = 0;
    for (int i = 0; i < BLOCK; i++) {
        q[i] = (int8_t)nearbyintf(x[i] * inv);
        sum[i >> 4] += q[i];
    }
}
#endif

/* x's rows quantized per block (quantize_block): xq [rows, k], scales xs [rows, k / 32],
 * half sums xsums [rows, k / 32, 2]. Compiled without -ffast-math (see int8_gemm.c's
 * quantize_rows): a division must stay a division. */
EXACT_FP __attribute__((unused)) static void quantize_blocks(
    const float *x, int64_t ldx, int8_t *xq, float *xs, int32_t *xsums, int64_t rows, int k,
    int num_threads) {
    const int nb = k / BLOCK;
#pragma omp parallel for num_threads(num_threads) if (rows * k > 65536)
    for (int64_t r = 0; r < rows; r++)
        for (int b = 0; b < nb; b++)
            quantize_block(x + r * ldx + b * BLOCK, xq + r * k + b * BLOCK, xs + r * nb + b,
                           xsums + (r * nb + b) * 2);
}

#endif
