/* A panel of output rows [n0, n1) of GGUF weight blocks dequantized to fp32 [n1 - n0, k]:
 * the prefill route of a GGUF linear on CPUs without AMX (cpu.gguf_linear: a panel at a
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

#include "gguf_scales.h"
#include "kernels.h"

#define BLOCK 32

static int unit_bytes(int qtype) {
    switch (qtype) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q8_0: return 34;
    case Q2_K: return 84;
    case Q3_K: return 110;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    default: return 0;
    }
}

static inline int unit_blocks(int qtype) { return qtype >= Q2_K && qtype <= Q6_K ? 8 : 1; }

/* Block s's integer scale of each half (16 values) and, for Q2_K, the minimum's integer
 * multiplier p (gguf_blocks._sub_scales, min_integers); 1 and 1 for the other types. */
static inline void sub_scales(const uint8_t *u, int s, int qtype, int sc[2], int p[2]) {
    for (int h = 0; h < 2; h++) {
        const int j = 2 * s + h;
        sc[h] = 1, p[h] = 1;
        if (qtype == Q6_K) {
            sc[h] = (int8_t)u[192 + j];
        } else if (qtype == Q3_K) {
            sc[h] = (((u[96 + (j & 7)] >> (4 * (j >> 3))) & 15) |
                     (((u[104 + (j & 3)] >> (2 * (j >> 2))) & 3) << 4)) - 32;
        } else if (qtype == Q2_K) {
            sc[h] = u[j] & 15, p[h] = u[j] >> 4;
        }
    }
}

#if defined(__AVX2__)
#include <immintrin.h>

static inline __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* (byte >> shift) & mask, for each of 32 bytes */
static inline __m256i field(__m256i bytes, int shift, int mask) {
    return _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(shift)),
                            _mm256_set1_epi8((char)mask));
}

/* 16 bytes of nibbles as 32 values: the low nibbles, then the high. */
static inline __m256i nibbles(const uint8_t *p) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)p);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F)),
                            _mm_and_si128(packed, _mm_set1_epi8(0x0F)));
}

/* 32 bits (value j: bit j) as 32 bytes: 16 where the bit is set, else 0. */
static inline __m256i fifth_bits(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                         3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                            _mm256_set1_epi8(16));
}

/* Block s's integers q (before any sub-scale) as 32 int8 in value order. */
static inline void block_integers(const uint8_t *u, int s, int qtype, int8_t q[BLOCK]) {
    __m256i v;
    switch (qtype) {
    case Q8_0: v = load32(u + 2); break;
    case Q4_0: v = _mm256_sub_epi8(nibbles(u + 2), _mm256_set1_epi8(8)); break;
    case Q4_1: v = nibbles(u + 4); break;
    case Q5_0:
        v = _mm256_sub_epi8(_mm256_or_si256(nibbles(u + 6), fifth_bits(u + 2)),
                            _mm256_set1_epi8(16));
        break;
    case Q5_1: v = _mm256_or_si256(nibbles(u + 8), fifth_bits(u + 4)); break;
    case Q2_K: v = field(load32(u + 16 + (s >> 2) * 32), 2 * (s & 3), 3); break;
    case Q3_K:
        v = _mm256_sub_epi8(_mm256_or_si256(field(load32(u + 32 + (s >> 2) * 32), 2 * (s & 3), 3),
                                            _mm256_slli_epi16(field(load32(u), s, 1), 2)),
                            _mm256_set1_epi8(4));
        break;
    case Q4_K: v = field(load32(u + 16 + (s >> 1) * 32), 4 * (s & 1), 15); break;
    case Q5_K:
        v = _mm256_or_si256(field(load32(u + 48 + (s >> 1) * 32), 4 * (s & 1), 15),
                            _mm256_slli_epi16(field(load32(u + 16), s, 1), 4));
        break;
    default: /* Q6_K */
        v = _mm256_sub_epi8(
            _mm256_or_si256(
                field(load32(u + (s >> 2) * 64 + (s & 1) * 32), 4 * ((s >> 1) & 1), 15),
                _mm256_slli_epi16(field(load32(u + 128 + (s >> 2) * 32), 2 * (s & 3), 3), 4)),
            _mm256_set1_epi8(32));
    }
    _mm256_storeu_si256((__m256i *)q, v);
}

#else /* plain C */

static inline int nibble(const uint8_t *p, int j) { return j < 16 ? p[j] & 15 : p[j - 16] >> 4; }

static inline int bit(const uint8_t *bits, int j) { return (bits[j >> 3] >> (j & 7)) & 1; }

static inline void block_integers(const uint8_t *u, int s, int qtype, int8_t q[BLOCK]) {
    for (int j = 0; j < BLOCK; j++) {
        int v;
        switch (qtype) {
        case Q8_0: v = (int8_t)u[2 + j]; break;
        case Q4_0: v = nibble(u + 2, j) - 8; break;
        case Q4_1: v = nibble(u + 4, j); break;
        case Q5_0: v = nibble(u + 6, j) + 16 * bit(u + 2, j) - 16; break;
        case Q5_1: v = nibble(u + 8, j) + 16 * bit(u + 4, j); break;
        case Q2_K: v = (u[16 + (s >> 2) * 32 + j] >> (2 * (s & 3))) & 3; break;
        case Q3_K:
            v = ((u[32 + (s >> 2) * 32 + j] >> (2 * (s & 3))) & 3) + 4 * ((u[j] >> s) & 1) - 4;
            break;
        case Q4_K: v = (u[16 + (s >> 1) * 32 + j] >> (4 * (s & 1))) & 15; break;
        case Q5_K:
            v = ((u[48 + (s >> 1) * 32 + j] >> (4 * (s & 1))) & 15) + 16 * ((u[16 + j] >> s) & 1);
            break;
        default: /* Q6_K */
            v = ((u[(s >> 2) * 64 + (s & 1) * 32 + j] >> (4 * ((s >> 1) & 1))) & 15) +
                16 * ((u[128 + (s >> 2) * 32 + j] >> (2 * (s & 3))) & 3) - 32;
        }
        q[j] = (int8_t)v;
    }
}
#endif

/* One weight row of k values (k / 32 blocks) into out. Inlined per block type, so the
 * compiler drops the other types' branches and vectorizes the per-value loop. */
static inline __attribute__((always_inline)) void dequantize_row(const uint8_t *row, int k,
                                                                 int qtype, float *out) {
    const int per_unit = unit_blocks(qtype), bytes = unit_bytes(qtype);
    const int with_min = qtype == Q4_1 || qtype == Q5_1 || qtype == Q2_K || qtype == Q4_K ||
                         qtype == Q5_K;
    float d[8], m[8];
    for (int b0 = 0; b0 < k / BLOCK; b0 += per_unit) {
        const uint8_t *unit = row + (int64_t)(b0 / per_unit) * bytes;
        gguf_unit_scales(unit, qtype, d, m);
        for (int s = 0; s < per_unit; s++) {
            int8_t q[BLOCK];
            int sc[2], p[2];
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
