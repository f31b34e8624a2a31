/* A panel of output rows [n0, n1) of GGUF weight blocks dequantized to fp32 [n1 - n0, k]:
 * the prefill route of a GGUF linear on CPUs without AMX (gguf_ops.gguf_linear: a panel at a
 * time into a reused buffer, then torch's sgemm over the prompt's rows). Bit for bit
 * gguf.quants.dequantize: each value is w = (d * sc) * q, rounded once, then + m (Q2_K:
 * + m * p): d, sc (the integer scale of 16 values, or 1), m and p exact (gguf_scales.h),
 * q an integer. BlockWeight.dequantize() computes d * (sc * q): the same values, but a zero
 * may carry the other sign. The layouts: gguf_gemm.c's top comment.
 *
 * Contraction of d * q + m into a fused multiply-add would round once instead of twice:
 * turned off for this file (build.py compiles every file with -ffast-math). */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <stdint.h>
#include <string.h>

#include "gguf_unpack.h"
#include "kernels.h"

/* Block s's integers q (before any sub-scale) as 32 int8 in value order. */
static inline void block_integers(const uint8_t *u, int s, int qtype, int8_t q[BLOCK]) {
#if defined(__AVX2__)
    _mm256_storeu_si256((__m256i *)q, block_bytes(u, s, qtype));
#else
    for (int j = 0; j < BLOCK; j++) q[j] = (int8_t)block_value(u, s, j, qtype);
#endif
}

/* One weight row of k values (k / 32 blocks) into out. Inlined per block type, so the
 * compiler drops the other types' branches and vectorizes the per-value loop. */
static inline __attribute__((always_inline)) void dequantize_row(const uint8_t *row, int k,
                                                                 int qtype, float *out) {
    const int per_unit = unit_blocks(qtype), bytes = unit_bytes(qtype);
    const int with_min = has_min(qtype);
    float d[8], m[8];
    for (int b0 = 0; b0 < k / BLOCK; b0 += per_unit) {
        const uint8_t *unit = row + (int64_t)(b0 / per_unit) * bytes;
        gguf_unit_scales(unit, qtype, d, m);
        for (int s = 0; s < per_unit; s++) {
            int8_t q[BLOCK];
            int32_t sc[2], p[2];
            block_integers(unit, s, qtype, q);
            sub_scales(unit, s, qtype, sc, p);
            float *o = out + (int64_t)(b0 + s) * BLOCK;
            for (int h = 0; h < 2; h++) {
                /* both exact: d * sc has at most 19 significant bits, p < 16 */
                const float ds = d[s] * (float)sc[h], mp = m[s] * (float)p[h];
                for (int j = 16 * h; j < 16 * h + 16; j++) {
                    const float w = ds * (float)q[j];
                    o[j] = with_min ? w + mp : w;
                }
            }
        }
    }
}

int gguf_dequantize_f32(const uint8_t *blocks, int qtype, int k, int64_t n0, int64_t n1,
                        float *out, int num_threads) {
    const int unit_values = unit_blocks(qtype) * BLOCK;
    if (!unit_bytes(qtype) || k % unit_values) return -1;
    const int64_t row_bytes = (int64_t)(k / unit_values) * unit_bytes(qtype);
#pragma omp parallel for num_threads(num_threads) schedule(static) if ((n1 - n0) * k > 1 << 15)
    for (int64_t r = n0; r < n1; r++) {
        const uint8_t *row = blocks + r * row_bytes;
        float *o = out + (r - n0) * k;
        switch (qtype) { /* one inlined copy per block type */
        case Q4_0: dequantize_row(row, k, Q4_0, o); break;
        case Q4_1: dequantize_row(row, k, Q4_1, o); break;
        case Q5_0: dequantize_row(row, k, Q5_0, o); break;
        case Q5_1: dequantize_row(row, k, Q5_1, o); break;
        case Q8_0: dequantize_row(row, k, Q8_0, o); break;
        case Q2_K: dequantize_row(row, k, Q2_K, o); break;
        case Q3_K: dequantize_row(row, k, Q3_K, o); break;
        case Q4_K: dequantize_row(row, k, Q4_K, o); break;
        case Q5_K: dequantize_row(row, k, Q5_K, o); break;
        case Q6_K: dequantize_row(row, k, Q6_K, o); break;
        }
    }
    return 0;
}
