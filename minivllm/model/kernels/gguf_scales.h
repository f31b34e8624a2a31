/* A GGUF block's fp32 scale d and minimum m (gguf_blocks.py's scales() and mins()), read
 * from the block's own fp16 and 6-bit fields where the kernel needs them: gguf_gemm.c and
 * amx_gemm.c read no fp32 side arrays, so a decode step streams the file's bytes and no
 * more. Each value is exact as gguf_blocks.py computes it: an fp16 times a 6-bit integer has
 * at most 17 significant bits. */
#ifndef MINIVLLM_GGUF_SCALES_H
#define MINIVLLM_GGUF_SCALES_H

#include <stdint.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#define Q4_0 2 /* gguf.GGMLQuantizationType values */
#define Q4_1 3
#define Q5_0 6
#define Q5_1 7
#define Q8_0 8
#define Q2_K 10
#define Q3_K 11
#define Q4_K 12
#define Q5_K 13
#define Q6_K 14

/* The fp16 at p as fp32 (exact: every fp16 is an fp32). */
static inline float gguf_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t exponent = (h >> 10) & 31, mantissa = h & 0x3ff;
    float f;
    if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24 */
        f = (float)mantissa * 0x1p-24f;
    } else {
        const uint32_t bits = exponent == 31 ? 0x7f800000u | mantissa << 13
                                             : (exponent + 112) << 23 | mantissa << 13;
        memcpy(&f, &bits, 4);
    }
    return h & 0x8000 ? -f : f;
#endif
}

/* Q4_K's and Q5_K's 6-bit scale and minimum of block s (0..7) from a super-block's 12
 * bytes at 4..15 (gguf_blocks._k_scales_and_mins). */
static inline void gguf_k_scale_min(const uint8_t *unit, int s, int *sc, int *m) {
    const uint8_t *q = unit + 4;
    if (s < 4) {
        *sc = q[s] & 63;
        *m = q[s + 4] & 63;
    } else {
        *sc = (q[s + 4] & 15) | ((q[s - 4] >> 6) << 4);
        *m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
}

/* The d and m (0 for the symmetric types) of each block of a unit: one for a block, 8 for
 * a K type's super-block. */
static inline void gguf_unit_scales(const uint8_t *unit, int qtype, float d[8], float m[8]) {
    int sc, mn;
    switch (qtype) {
    case Q4_1:
    case Q5_1: d[0] = gguf_half(unit), m[0] = gguf_half(unit + 2); return;
    case Q4_K:
    case Q5_K: {
        const float d_unit = gguf_half(unit), dmin = gguf_half(unit + 2);
        for (int s = 0; s < 8; s++) {
            gguf_k_scale_min(unit, s, &sc, &mn);
            d[s] = d_unit * (float)sc, m[s] = -(dmin * (float)mn);
        }
        return;
    }
    case Q2_K:
        for (int s = 0; s < 8; s++) d[s] = gguf_half(unit + 80), m[s] = -gguf_half(unit + 82);
        return;
    case Q3_K:
    case Q6_K:
        for (int s = 0; s < 8; s++)
            d[s] = gguf_half(unit + (qtype == Q3_K ? 108 : 208)), m[s] = 0.f;
        return;
    default: d[0] = gguf_half(unit), m[0] = 0.f; return; /* Q4_0, Q5_0, Q8_0 */
    }
}

#endif
