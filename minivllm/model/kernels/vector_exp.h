/* What the two bf16 prefill attention kernels (amx_attention.c, dpbf16_attention.c) share:
 * e^x for x <= 0 on 16 lanes. Included only where the build has AVX-512. */
#ifndef MINIVLLM_VECTOR_EXP_H
#define MINIVLLM_VECTOR_EXP_H

#include <immintrin.h>

/* 2^(x log2 e) as 2^n (scalef) times 2^f, f in [-1/2, 1/2], by its Taylor polynomial of
 * degree 6 (relative error ~2e-7, from x log2 e's rounding ~5e-6 at x = -80); x below -80
 * is taken as -80 (e^-80 ~ 2e-35: nothing next to the e^0 of a row's max, and no
 * denormals). libm's vector expf, 8 lanes, took half the AMX kernel's time. */
static inline __m512 exp_nonpositive(__m512 x) {
    const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-80.f)),
                                   _mm512_set1_ps(1.44269504f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.5403530e-4f); /* ln2^k / k!, k = 6 .. 0 */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

#endif
