/* gguf_repacked.c's tiles with AVX2: a panel as two halves of 8 columns, vpmaddubsw +
 * vpmaddwd. What gguf_repacked.c's loop calls, as gguf_repacked_avx512.h. */
#ifndef MINIVLLM_GGUF_REPACKED_AVX2_H
#define MINIVLLM_GGUF_REPACKED_AVX2_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_activations.h"
#include "gguf_repacked.h"

#define TILE_PANELS 1
#define MAX_ROWS 4 /* rows of x per tile: 16 ymm registers */
static inline int tile_rows(int qtype, int np) { (void)qtype, (void)np; return MAX_ROWS; }
/* Whether a task of `rows` rows unpacks its panel once into a buffer for all its tiles:
 * from 17 rows; below, writing and reading the buffer costs more than unpacking per tile
 * (measured on Qwen2.5-0.5B's linears: 2% slower at 16 rows, 6% faster at 32, 20% at 512). */
static inline int buffered(int64_t rows) { return rows > 16; }
#define HALF (PANEL / 2) /* columns per ymm */

/* Half a block's 8 quads of 8 columns x 4 values from its planes at p (gguf_repacked.h) */
static inline __attribute__((always_inline)) void unpack(const uint8_t *p, int bits,
                                                         __m256i w[8]) {
    if (bits == 8) {
        for (int t = 0; t < 8; t++) w[t] = _mm256_loadu_si256((const __m256i *)(p + 32 * t));
        return;
    }
    const __m256i low = _mm256_set1_epi8(15);
    for (int h = 0; h < 4; h++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 32 * h));
        w[h] = _mm256_and_si256(v, low);
        w[h + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
    if (bits == 6) { /* two planes of crumbs: plane h, bits 2t..2t+1 of each byte: quad 4h + t's
                      * bits 4-5 (2 or 3 instructions a quad where a plane per bit took 6) */
        const __m256i high = _mm256_set1_epi8(0x30);
        for (int h = 0; h < 2; h++) {
            const __m256i plane = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
            for (int t = 0; t < 4; t++) { /* bits crossing into the next byte miss the mask */
                const __m256i moved = t < 2    ? _mm256_slli_epi16(plane, 4 - 2 * t)
                                      : t == 2 ? plane
                                               : _mm256_srli_epi16(plane, 2);
                w[4 * h + t] = _mm256_or_si256(w[4 * h + t], _mm256_and_si256(moved, high));
            }
        }
        return;
    }
    for (int bit = 4; bit < bits; bit++) { /* bit t of each byte: quad t's bit `bit` */
        const __m256i plane = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * (bit - 4)));
        const __m256i one = _mm256_set1_epi8((char)(1 << bit));
        for (int t = 0; t < 8; t++) { /* within each byte: no bit crosses into the next */
            const __m256i moved = t < bit ? _mm256_slli_epi16(plane, bit - t)
                                          : _mm256_srli_epi16(plane, t - bit);
            w[t] = _mm256_or_si256(w[t], _mm256_and_si256(moved, one));
        }
    }
}

/* The bytes PREFETCH ahead of the unit at p asked for, as many as a unit has: the whole
 * stream, headers included (asking for each half's planes only, 128 of every 256 bytes, left
 * the headers to demand misses: a 7B Q4_K matrix streamed at a quarter of one core's read
 * bandwidth) */
static inline __attribute__((always_inline)) void prefetch_unit(const uint8_t *p, int qtype) {
    for (int64_t at = 0; at < panel_unit_bytes(qtype); at += 64)
        _mm_prefetch((const char *)p + PREFETCH + at, _MM_HINT_T0);
}

static inline __m256 half_scales(const uint8_t *p) { /* 8 fp16 as fp32 */
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 byte_scales(const uint8_t *p) { /* 8 unsigned bytes as fp32 */
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline __m256i x4(const int8_t *x) { /* 4 bytes of x in every lane */
    int32_t v;
    memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

/* acc[i] += block b of row i of x times the unpacked half block w (8 columns); u: |w| for
 * Q8_0 (signed), as gguf_gemm.c's AVX2 sign trick */
static inline __attribute__((always_inline)) void block_rows(
    const int8_t *xq, int k, const float *xs, const int32_t *xsums, int b, const __m256i w[8],
    const __m256i u[8], int qtype, int nr, __m256 d, __m256 mins, __m256 sc0, __m256 sc1,
    __m256 acc[MAX_ROWS]) {
    const int nb = k / BLOCK;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < nr; i++) {
        const int8_t *x = xq + (int64_t)i * k + b * BLOCK;
        __m256i half_sums[2];
        if (qtype == Q6_K || qtype == Q8_0) { /* per half, two quads at a time */
            for (int h = 0; h < 2; h++) {
                __m256i s = _mm256_setzero_si256();
                for (int t = 4 * h; t < 4 * h + 4; t += 2) {
                    __m256i pairs;
                    if (qtype == Q8_0) { /* |w| * (x with w's sign): each pair below 2^15 */
                        pairs = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(u[t], _mm256_sign_epi8(x4(x + 4 * t), w[t])),
                            ones);
                        s = _mm256_add_epi32(s, pairs);
                        pairs = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(u[t + 1],
                                                 _mm256_sign_epi8(x4(x + 4 * t + 4), w[t + 1])),
                            ones);
                    } else { /* q <= 63: two quads' pairs summed in int16 stay below 2^15 */
                        pairs = _mm256_madd_epi16(
                            _mm256_add_epi16(_mm256_maddubs_epi16(w[t], x4(x + 4 * t)),
                                             _mm256_maddubs_epi16(w[t + 1], x4(x + 4 * t + 4))),
                            ones);
                    }
                    s = _mm256_add_epi32(s, pairs);
                }
                half_sums[h] = s;
            }
        } else { /* the whole block in int16 before one widening per group: |pairs| <= 2 *
                  * 127 * q, so 8 quads of 4 bits (<= 30480) or 4 of 5 (<= 31496) fit */
            const int group = panel_bits(qtype) == 4 ? 8 : 4;
            __m256i s = _mm256_setzero_si256();
            for (int t0 = 0; t0 < 8; t0 += group) {
                __m256i p16 = _mm256_maddubs_epi16(w[t0], x4(x + 4 * t0));
                for (int t = t0 + 1; t < t0 + group; t++)
                    p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(w[t], x4(x + 4 * t)));
                s = _mm256_add_epi32(s, _mm256_madd_epi16(p16, ones));
            }
            half_sums[0] = s, half_sums[1] = _mm256_setzero_si256();
        }
        const int32_t *half = xsums + ((int64_t)i * nb + b) * 2;
        const float sx = xs[(int64_t)i * nb + b];
        __m256 s;
        if (qtype == Q6_K) { /* Q6_K_EXACT: the integer sum, in fp32 without vpmulld */
            s = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(_mm256_sub_epi32(half_sums[0], _mm256_set1_epi32(32 * half[0]))),
                sc0,
                _mm256_mul_ps(_mm256_cvtepi32_ps(
                                  _mm256_sub_epi32(half_sums[1], _mm256_set1_epi32(32 * half[1]))),
                              sc1));
        } else {
            __m256i si = _mm256_add_epi32(half_sums[0], half_sums[1]);
            if (panel_offset(qtype))
                si = _mm256_sub_epi32(
                    si, _mm256_set1_epi32(panel_offset(qtype) * (half[0] + half[1])));
            s = _mm256_cvtepi32_ps(si);
        }
        acc[i] = _mm256_fmadd_ps(s, _mm256_mul_ps(d, _mm256_set1_ps(sx)), acc[i]);
        if (has_min(qtype))
            acc[i] = _mm256_fmadd_ps(mins, _mm256_set1_ps(sx * (float)(half[0] + half[1])),
                                     acc[i]);
    }
}

/* Half `side` (8 columns) of one block of a panel as the microkernel takes it: its 8 quads,
 * for Q8_0 their absolute values too, the per-column d (K types: d times the block's scale),
 * minimum m (0 where none) and Q6_K's int8 half scales as fp32. */
typedef struct {
    __m256i w[8], u[8];
    __m256 d, m, sc0, sc1;
} unpacked_block;

#define SIDES 2 /* a panel's blocks are unpacked per half: [side][block] */

/* Block b's half `side` of the panel at p, unpacked (the bytes PREFETCH ahead asked for). */
static inline __attribute__((always_inline)) void unpack_block(const uint8_t *p, int qtype,
                                                               int b, int side,
                                                               unpacked_block *o) {
    const int bits = panel_bits(qtype), per = unit_blocks(qtype), s = b % per;
    const int planes = plane_bytes(bits);
    const uint8_t *unit = p + (int64_t)(b / per) * panel_unit_bytes(qtype);
    unpack(unit + header_bytes(qtype) + s * planes + side * planes / 2, bits, o->w);
    if (qtype == Q8_0)
        for (int t = 0; t < 8; t++) o->u[t] = _mm256_sign_epi8(o->w[t], o->w[t]);
    const __m256 d = half_scales(unit + side * HALF * 2);
    const __m256 m = has_min(qtype) ? half_scales(unit + 32 + side * HALF * 2)
                                    : _mm256_setzero_ps();
    const uint8_t *scales = unit + (qtype == Q6_K ? 32 : 64) + side * HALF;
    const uint8_t *minima = scales + 8 * PANEL;
    o->d = d, o->m = m, o->sc0 = o->sc1 = _mm256_setzero_ps();
    if (qtype == Q6_K) {
        o->sc0 = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(scales + 2 * s * PANEL))));
        o->sc1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64((const __m128i *)(scales + (2 * s + 1) * PANEL))));
    } else if (qtype == Q4_K || qtype == Q5_K) { /* as gguf_scales.h's, exact */
        o->d = _mm256_mul_ps(d, byte_scales(scales + s * PANEL));
        o->m = _mm256_sub_ps(_mm256_setzero_ps(),
                             _mm256_mul_ps(m, byte_scales(minima + s * PANEL)));
    }
}

/* The whole panel, both halves, into `out` ([side][block]) for a task's many tiles. */
static void unpack_panel(const uint8_t *p, int qtype, int nb, unpacked_block *out) {
    for (int b = 0; b < nb; b++) {
        if (b % unit_blocks(qtype) == 0)
            prefetch_unit(p + (int64_t)(b / unit_blocks(qtype)) * panel_unit_bytes(qtype), qtype);
        for (int side = 0; side < SIDES; side++)
            unpack_block(p, qtype, b, side, out + side * nb + b);
    }
}

/* acc[side][0..nr) = rows 0..nr of x (quantized) times each half (8 columns) of a panel: its
 * blocks from `unpacked` ([side][block], unpacked once for a task's tiles), else unpacked here
 * a unit at a time (its header read once; unpack_block's struct per block spills on AVX2's 16
 * registers: 9% slower at 8 rows, measured). Up to 2 rows, both halves of a unit in turn: one
 * sweep of the panel (a sweep per half left the memory idle during the second, the panel in
 * L2 by then and nothing asked for: 0.6-0.8x the bandwidth at 1 row); from 3 rows a sweep
 * per half, the first asking for the bytes (both halves' accumulators do not fit the 16
 * registers: 5-30% slower at 4-8 rows in cache, where bandwidth matters less). */
static inline __attribute__((always_inline)) void panel_tile(
    const int8_t *xq, int k, const float *xs, const int32_t *xsums, const uint8_t *p,
    const unpacked_block *unpacked, int qtype, int nr, __m256 acc[SIDES][MAX_ROWS]) {
    const int bits = panel_bits(qtype), planes = plane_bytes(bits), nb = k / BLOCK;
    const __m256 none = _mm256_setzero_ps();
    for (int side = 0; side < SIDES; side++)
        for (int i = 0; i < nr; i++) acc[side][i] = _mm256_setzero_ps();
    if (unpacked) {
        for (int side = 0; side < SIDES; side++)
            for (int b = 0; b < nb; b++) {
                const unpacked_block *u = unpacked + side * nb + b;
                block_rows(xq, k, xs, xsums, b, u->w, u->u, qtype, nr, u->d, u->m, u->sc0,
                           u->sc1, acc[side]);
            }
        return;
    }
    const int together = nr <= 2, unit = (int)panel_unit_bytes(qtype);
    __m256i w[8], u[8];
    for (int first = 0; first < SIDES; first += together ? SIDES : 1) {
        const uint8_t *head = p; /* a unit's header */
        for (int b0 = 0; b0 < nb; b0 += unit_blocks(qtype), head += unit) {
            if (first == 0) prefetch_unit(head, qtype);
            const uint8_t *planes0 = head + header_bytes(qtype);
            for (int side = first; side < (together ? SIDES : first + 1); side++) {
                const __m256 d = half_scales(head + side * HALF * 2);
                const __m256 m = has_min(qtype) ? half_scales(head + 32 + side * HALF * 2)
                                                : _mm256_setzero_ps();
                const uint8_t *scales = head + (qtype == Q6_K ? 32 : 64) + side * HALF;
                const uint8_t *minima = scales + 8 * PANEL;
                for (int s = 0; s < unit_blocks(qtype); s++) {
                    unpack(planes0 + s * planes + side * planes / 2, bits, w);
                    if (qtype == Q8_0)
                        for (int t = 0; t < 8; t++) u[t] = _mm256_sign_epi8(w[t], w[t]);
                    if (qtype == Q6_K) {
                        const __m256 sc0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                            _mm_loadl_epi64((const __m128i *)(scales + 2 * s * PANEL))));
                        const __m256 sc1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                            _mm_loadl_epi64((const __m128i *)(scales + (2 * s + 1) * PANEL))));
                        block_rows(xq, k, xs, xsums, b0 + s, w, u, qtype, nr, d, m, sc0, sc1,
                                   acc[side]);
                    } else if (qtype == Q4_K || qtype == Q5_K) { /* as gguf_scales.h's, exact */
                        const __m256 ds = _mm256_mul_ps(d, byte_scales(scales + s * PANEL));
                        const __m256 ms = _mm256_sub_ps(
                            _mm256_setzero_ps(),
                            _mm256_mul_ps(m, byte_scales(minima + s * PANEL)));
                        block_rows(xq, k, xs, xsums, b0 + s, w, u, qtype, nr, ds, ms, none,
                                   none, acc[side]);
                    } else {
                        block_rows(xq, k, xs, xsums, b0 + s, w, u, qtype, nr, d, m, none,
                                   none, acc[side]);
                    }
                }
            }
        }
    }
}

/* y's rows r.. (nr of them), columns c0.. (cols of them) = x's rows times the panel p */
/* (one panel a tile: np 1, second unused; never gated, see gguf_repacked_silu_mul_f32) */
static inline __attribute__((always_inline)) void tile(
    const int8_t *xq, int k, const float *xs, const int32_t *xsums, const uint8_t *p,
    int64_t second, const unpacked_block *unpacked, int qtype, int nr, int np, int gated,
    const float *bias, const float *residual, int64_t ldr, float *y, int n, int cols) {
    (void)second, (void)np, (void)gated;
    __m256 acc[SIDES][MAX_ROWS];
    panel_tile(xq, k, xs, xsums, p, unpacked, qtype, nr, acc);
    for (int side = 0; side < SIDES && side * HALF < cols; side++) {
        const int c0 = side * HALF, width = cols - c0 < HALF ? cols - c0 : HALF;
        for (int i = 0; i < nr; i++) {
            float out[HALF];
            _mm256_storeu_ps(out, acc[side][i]);
            for (int c = 0; c < width; c++) {
                float v = out[c];
                if (bias) v += bias[c0 + c];
                if (residual) v += residual[i * ldr + c0 + c];
                y[(int64_t)i * n + c0 + c] = v;
            }
        }
    }
}

#define TILES(TYPE) TILE(TYPE, 1, 1) TILE(TYPE, 1, 2) TILE(TYPE, 1, 3) TILE(TYPE, 1, 4)
#define TILES_Q6_K TILES(Q6_K)

#endif
