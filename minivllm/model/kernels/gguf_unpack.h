/* A GGUF block's integers as the file stores them, for the kernels that read the blocks
 * (gguf_gemm.c's integer GEMM, gguf_dequant.c's fp32 panels): the sizes of each type's unit
 * (a block of 32, or a K type's super-block of 8 blocks), the K types' per-16 integer scales,
 * and block s's 32 integers wq in value order (AVX2: as 32 bytes; plain C: value by value).
 * The layouts are described at the top of gguf_gemm.c; the scales d and minima m are
 * gguf_scales.h's. */
#ifndef MINIVLLM_GGUF_UNPACK_H
#define MINIVLLM_GGUF_UNPACK_H

#include <stdint.h>
#include <string.h>

#include "gguf_scales.h"

#define BLOCK 32 /* values per block (per scale) */

static inline int is_k_type(int qtype) { return qtype >= Q2_K && qtype <= Q6_K; }

/* Bytes of the unit the file stores (a block, or a K type's super-block of 8), 0 if unread. */
static inline int unit_bytes(int qtype) {
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

/* w = d * wq + m, wq unsigned; the other types are symmetric, wq signed. */
static inline int has_min(int qtype) {
    return qtype == Q4_1 || qtype == Q5_1 || qtype == Q2_K || qtype == Q4_K || qtype == Q5_K;
}

/* Two integer scales per block of 32, one per 16 values. */
static inline int has_sub_scales(int qtype) {
    return qtype == Q2_K || qtype == Q3_K || qtype == Q6_K;
}

/* Blocks of 32 per unit */
static inline int unit_blocks(int qtype) { return is_k_type(qtype) ? 8 : 1; }

/* Block s's integer scales of its two halves of 16 values, and for Q2_K their minima. */
static inline void sub_scales(const uint8_t *unit, int s, int qtype, int32_t sc[2],
                              int32_t m[2]) {
    for (int h = 0; h < 2; h++) {
        sc[h] = 1, m[h] = 1; /* the types without sub-scales */
        const int j = 2 * s + h; /* 0..15 */
        if (qtype == Q6_K) {
            sc[h] = (int8_t)unit[192 + j];
        } else if (qtype == Q3_K) { /* low 4 bits: nibbles of bytes 0-7; high 2: crumbs of 8-11 */
            sc[h] = (((unit[96 + (j & 7)] >> (4 * (j >> 3))) & 15) |
                     (((unit[104 + (j & 3)] >> (2 * (j >> 2))) & 3) << 4)) - 32;
        } else if (qtype == Q2_K) {
            sc[h] = unit[j] & 15;
            m[h] = unit[j] >> 4;
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

/* 16 bytes of nibbles as 32 values in order: the low nibbles, then the high. */
static inline __m256i nibbles(const uint8_t *packed_bytes) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)packed_bytes);
    const __m128i low = _mm_and_si128(packed, _mm_set1_epi8(0x0F));
    const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F));
    return _mm256_set_m128i(high, low);
}

/* 32 bits (value j: bit j) as 32 bytes, 16 where the bit is set, else 0. */
static inline __m256i fifth_bits(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i spread = _mm256_shuffle_epi8( /* byte j holds bits' byte j / 8 */
        _mm256_set1_epi32((int)bits),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                         3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201); /* byte j: bit j % 8 */
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                            _mm256_set1_epi8(16));
}

/* Block s of a unit (block_value's integers) as 32 bytes in value order. */
static inline __m256i block_bytes(const uint8_t *u, int s, int qtype) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    /* Q5_0 / Q5_1's 32 fifth bits are a byte mask as they are: one masked add */
    uint32_t bits;
    if (qtype == Q5_0 || qtype == Q5_1) memcpy(&bits, u + (qtype == Q5_0 ? 2 : 4), 4);
    if (qtype == Q5_0) /* nibble - 16 where the bit is clear */
        return _mm256_mask_sub_epi8(nibbles(u + 6), (__mmask32)~bits, nibbles(u + 6),
                                    _mm256_set1_epi8(16));
    if (qtype == Q5_1)
        return _mm256_mask_add_epi8(nibbles(u + 8), (__mmask32)bits, nibbles(u + 8),
                                    _mm256_set1_epi8(16));
#endif
    switch (qtype) {
    case Q8_0: return load32(u + 2);
    case Q4_0: return _mm256_sub_epi8(nibbles(u + 2), _mm256_set1_epi8(8));
    case Q4_1: return nibbles(u + 4);
    case Q5_0:
        return _mm256_sub_epi8(_mm256_or_si256(nibbles(u + 6), fifth_bits(u + 2)),
                               _mm256_set1_epi8(16));
    case Q5_1: return _mm256_or_si256(nibbles(u + 8), fifth_bits(u + 4));
    case Q2_K: return field(load32(u + 16 + (s >> 2) * 32), 2 * (s & 3), 3);
    case Q3_K:
        return _mm256_sub_epi8(
            _mm256_or_si256(field(load32(u + 32 + (s >> 2) * 32), 2 * (s & 3), 3),
                            _mm256_slli_epi16(field(load32(u), s, 1), 2)),
            _mm256_set1_epi8(4));
    case Q4_K: return field(load32(u + 16 + (s >> 1) * 32), 4 * (s & 1), 15);
    case Q5_K:
        return _mm256_or_si256(field(load32(u + 48 + (s >> 1) * 32), 4 * (s & 1), 15),
                               _mm256_slli_epi16(field(load32(u + 16), s, 1), 4));
    case Q6_K:
        return _mm256_sub_epi8(
            _mm256_or_si256(
                field(load32(u + (s >> 2) * 64 + (s & 1) * 32), 4 * ((s >> 1) & 1), 15),
                _mm256_slli_epi16(field(load32(u + 128 + (s >> 2) * 32), 2 * (s & 3), 3), 4)),
            _mm256_set1_epi8(32));
    default: return _mm256_setzero_si256();
    }
}

#else /* another architecture, or x86 below AVX2 */

static inline int nibble(const uint8_t *packed_bytes, int j) {
    return j < 16 ? packed_bytes[j] & 15 : packed_bytes[j - 16] >> 4;
}

static inline int bit(const uint8_t *bits, int j) { return (bits[j >> 3] >> (j & 7)) & 1; }

/* Value j of block s of a unit: its integer wq (see the top of the file). */
static inline int block_value(const uint8_t *u, int s, int j, int qtype) {
    switch (qtype) {
    case Q8_0: return (int8_t)u[2 + j];
    case Q4_0: return nibble(u + 2, j) - 8;
    case Q4_1: return nibble(u + 4, j);
    case Q5_0: return nibble(u + 6, j) + 16 * bit(u + 2, j) - 16;
    case Q5_1: return nibble(u + 8, j) + 16 * bit(u + 4, j);
    case Q2_K: return (u[16 + (s >> 2) * 32 + j] >> (2 * (s & 3))) & 3;
    case Q3_K:
        return ((u[32 + (s >> 2) * 32 + j] >> (2 * (s & 3))) & 3) + 4 * ((u[j] >> s) & 1) - 4;
    case Q4_K: return (u[16 + (s >> 1) * 32 + j] >> (4 * (s & 1))) & 15;
    case Q5_K:
        return ((u[48 + (s >> 1) * 32 + j] >> (4 * (s & 1))) & 15) + 16 * ((u[16 + j] >> s) & 1);
    case Q6_K:
        return ((u[(s >> 2) * 64 + (s & 1) * 32 + j] >> (4 * ((s >> 1) & 1))) & 15) +
               16 * ((u[128 + (s >> 2) * 32 + j] >> (2 * (s & 3))) & 3) - 32;
    default: return 0;
    }
}

#endif

#endif
