/* The linear layer over GGUF weights repacked at load (gguf_repacked.h's layout,
 * gguf_repack.c; linear_gguf.py). The arithmetic of gguf_gemm.c: x quantized per row and
 * block of 32 to int8 (gguf_activations.h), each block's integer dot product exact in
 * int32, scaled in fp32; but one instruction serves many columns at once:
 *
 *   AVX-512 VNNI: vpdpbusd(acc, W, broadcast(4 bytes of x)): lane c += the 4 products of
 *                 column c, 16 columns;
 *   AVX2:         vpmaddubsw + vpmaddwd, the same for 8 columns (two quads' int16 pairs
 *                 summed first: |q| <= 63 keeps them below 2^15; Q8_0 signed, with
 *                 llama.cpp's sign trick);
 *
 * so a block of 32 values costs 8 of them per row of x, where gguf_gemm.c spends one per
 * column and then sums lanes: no horizontal sums, the columns' fp16 scales converted by one
 * vcvtph2ps, and a block unpacked once for up to MAX_ROWS rows of x.
 *
 * Q6_K_EXACT: a Q6_K block's two halves times their int8 scales are summed in fp32, not
 * with vpmulld (two uops on one port, the slowest part of its prefill): each half's product
 * is below 16 * 32 * 127 * 128 < 2^23 and their sum below 2^24, so both are exact and the
 * result is the integer sum's, bit for bit.
 *
 * Every output is its blocks' terms accumulated in K order whatever the number of rows or
 * how they are tiled: a row's result does not depend on the batch it runs in. Each thread
 * streams its panels and asks for the bytes PREFETCH ahead (a matrix is a short stream: the
 * hardware prefetcher would still be ramping up at its end). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_activations.h"
#include "gguf_repacked.h"
#include "kernels.h"

#define CHUNK 64 /* rows of x per task: a tile of few columns still splits among threads */
#define PREFETCH 3072 /* bytes ahead in the stream (1-4 KiB measured: 3 the best) */

#if defined(REPACKED_AVX512)

/* A block's 8 quads of 16 columns x 4 unsigned values from its planes at p; the bytes
 * PREFETCH ahead asked for now. */
static inline __attribute__((always_inline)) void unpack(const uint8_t *p, int bits,
                                                         __m512i w[8]) {
    for (int at = 0; at < plane_bytes(bits); at += 64)
        _mm_prefetch((const char *)p + PREFETCH + at, _MM_HINT_T0);
    if (bits == 8) {
        for (int t = 0; t < 8; t++) w[t] = _mm512_loadu_si512(p + 64 * t);
        return;
    }
    const __m512i low = _mm512_set1_epi8(15);
    for (int h = 0; h < 4; h++) {
        const __m512i v = _mm512_loadu_si512(p + 64 * h);
        w[h] = _mm512_and_si512(v, low);
        w[h + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    for (int bit = 4; bit < bits; bit++) {
        const uint8_t *plane = p + 256 + 64 * (bit - 4);
        for (int t = 0; t < 8; t++) {
            uint64_t mask;
            memcpy(&mask, plane + 8 * t, 8);
            w[t] = _mm512_mask_add_epi8(w[t], (__mmask64)mask, w[t],
                                        _mm512_set1_epi8((char)(1 << bit)));
        }
    }
}

static inline __m512 half_scales(const uint8_t *p) { /* 16 fp16 as fp32 */
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

static inline __m512 byte_scales(const uint8_t *p) { /* 16 unsigned bytes as fp32 */
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

static inline __m512i x4(const int8_t *x) { /* 4 bytes of x in every lane */
    int32_t v;
    memcpy(&v, x, 4);
    return _mm512_set1_epi32(v);
}

/* One block of a panel as the microkernel takes it: its 8 quads of 16 columns x 4 values,
 * and its per-column scale d (K types: d times the block's scale), minimum m (0 where the
 * type has none) and, for Q6_K, the int8 half scales as fp32. */
typedef struct {
    __m512i w[8];
    __m512 d, m, sc0, sc1;
} unpacked_block;

/* Block b of the panel at p, unpacked (the bytes PREFETCH ahead asked for). */
static inline __attribute__((always_inline)) void unpack_block(const uint8_t *p, int qtype,
                                                               int b, unpacked_block *u) {
    const int bits = panel_bits(qtype), per = unit_blocks(qtype), s = b % per;
    const uint8_t *unit = p + (int64_t)(b / per) * panel_unit_bytes(qtype);
    unpack(unit + header_bytes(qtype) + s * plane_bytes(bits), bits, u->w);
    const __m512 d = half_scales(unit);
    u->sc0 = u->sc1 = u->m = _mm512_setzero_ps();
    if (!is_k_type(qtype)) {
        u->d = d;
        if (has_min(qtype)) u->m = half_scales(unit + 32);
    } else if (qtype == Q6_K) {
        const uint8_t *scales = unit + 32;
        u->d = d;
        u->sc0 = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(scales + 2 * s * PANEL))));
        u->sc1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i *)(scales + (2 * s + 1) * PANEL))));
    } else { /* d * scale and -(dmin * minimum), exact in fp32 as gguf_scales.h's */
        const uint8_t *scales = unit + 64, *minima = scales + 8 * PANEL;
        u->d = _mm512_mul_ps(d, byte_scales(scales + s * PANEL));
        u->m = _mm512_sub_ps(_mm512_setzero_ps(),
                             _mm512_mul_ps(half_scales(unit + 32),
                                           byte_scales(minima + s * PANEL)));
    }
}

#define SIDES 1 /* a panel's blocks are unpacked whole */

/* The whole panel into `out`, for a task's many tiles. */
static void unpack_panel(const uint8_t *p, int qtype, int nb, unpacked_block *out) {
    for (int b = 0; b < nb; b++) unpack_block(p, qtype, b, out + b);
}

/* Past MAX_ROWS rows a tile is up to 6 rows of x times 2 panels (32 columns): each
 * broadcast of 4 bytes of x feeds two vpdpbusd, and 12 int32 chains and 12 fp32 sums stay
 * in registers (tiles of one panel spend a broadcast per vpdpbusd: 52-57% of vpdpbusd's
 * peak at 512 rows on Qwen2.5-0.5B's Q5_0 linears, against 64-73% so; its Q6_K 46 -> 57%,
 * benchmarks/gemm_roof.py). Q6_K's two halves
 * each need their own chains: 4 rows. Up to MAX_ROWS rows (decode, small batches) a tile is
 * all the rows times one panel: one tile per panel, so no panel is unpacked twice. */
#define TILE_PANELS 2
#define MAX_ROWS 8
static inline int tile_rows(int qtype, int np) {
    return np == 1 ? MAX_ROWS : qtype == Q6_K ? 4 : 6;
}
/* Whether a task of `rows` rows unpacks its panels once into a buffer for all its tiles:
 * past MAX_ROWS (up to it the rows are one tile, or a gated call's tiles of 4, which unpack
 * their panels faster than they buffer them). */
static inline int buffered(int64_t rows) { return rows > MAX_ROWS; }

/* acc[i][h] += block b of row i of x times block b of the tile's panel h (u[h]). Each
 * int32 chain starts from -offset * sum(x's block) (Q6_K: of its half), taking back the
 * offset the unsigned weights carry, so it ends as the signed integer dot product; Q6_K's
 * halves then as Q6_K_EXACT says. */
static inline __attribute__((always_inline)) void block_tile(
    const int8_t *xq, int k, const float *xs, const int32_t *xsums, int b,
    const unpacked_block *const u[TILE_PANELS], int qtype, int nr, int np,
    __m512 acc[MAX_ROWS][TILE_PANELS]) {
    const int nb = k / BLOCK, off = panel_offset(qtype), halves = qtype == Q6_K;
    __m512i s[MAX_ROWS][TILE_PANELS], s1[MAX_ROWS][TILE_PANELS]; /* s1: Q6_K's second half */
    for (int i = 0; i < nr; i++) {
        const int32_t *half = xsums + ((int64_t)i * nb + b) * 2;
        const __m512i start = _mm512_set1_epi32(-off * (halves ? half[0] : half[0] + half[1]));
        const __m512i start1 = _mm512_set1_epi32(-off * half[1]);
        for (int h = 0; h < np; h++) {
            s[i][h] = start;
            if (halves) s1[i][h] = start1;
        }
    }
    for (int t = 0; t < 8; t++) {
        __m512i w[TILE_PANELS];
        for (int h = 0; h < np; h++) w[h] = u[h]->w[t];
        for (int i = 0; i < nr; i++) {
            const __m512i xv = x4(xq + (int64_t)i * k + b * BLOCK + 4 * t);
            for (int h = 0; h < np; h++) {
                if (halves && t >= 4)
                    s1[i][h] = _mm512_dpbusd_epi32(s1[i][h], w[h], xv);
                else
                    s[i][h] = _mm512_dpbusd_epi32(s[i][h], w[h], xv);
            }
        }
    }
    for (int i = 0; i < nr; i++) {
        const int32_t *half = xsums + ((int64_t)i * nb + b) * 2;
        const float sx = xs[(int64_t)i * nb + b];
        for (int h = 0; h < np; h++) {
            const __m512 v = halves ? _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i][h]), u[h]->sc0,
                                                      _mm512_mul_ps(_mm512_cvtepi32_ps(s1[i][h]),
                                                                    u[h]->sc1))
                                    : _mm512_cvtepi32_ps(s[i][h]);
            acc[i][h] = _mm512_fmadd_ps(v, _mm512_mul_ps(u[h]->d, _mm512_set1_ps(sx)), acc[i][h]);
            if (has_min(qtype))
                acc[i][h] = _mm512_fmadd_ps(
                    u[h]->m, _mm512_set1_ps(sx * (float)(half[0] + half[1])), acc[i][h]);
        }
    }
}

/* y's rows r.. (nr of them), columns c0.. (cols of them, up to np * 16; row stride n) = x's
 * rows times the np panels p and p + second (second 0: a last lone panel runs twice, its
 * copy's columns not written), their blocks from `unpacked` (the tile's panels, unpacked
 * once for a task's many tiles: [panel][block]), else unpacked here. gated: the panels are
 * a gate's columns and the matching up's, and y = silu(gate) * up (cols 16). */
static inline __attribute__((always_inline)) void tile(
    const int8_t *xq, int k, const float *xs, const int32_t *xsums, const uint8_t *p,
    int64_t second, const unpacked_block *unpacked, int qtype, int nr, int np, int gated,
    const float *bias, const float *residual, int64_t ldr, float *y, int n, int cols) {
    const int nb = k / BLOCK;
    const uint8_t *panels[TILE_PANELS] = {p, p + second};
    __m512 acc[MAX_ROWS][TILE_PANELS];
    for (int i = 0; i < nr; i++)
        for (int h = 0; h < np; h++) acc[i][h] = _mm512_setzero_ps();
    if (unpacked) {
        for (int b = 0; b < nb; b++) {
            const unpacked_block *u[TILE_PANELS] = {unpacked + b, unpacked + (np - 1) * nb + b};
            block_tile(xq, k, xs, xsums, b, u, qtype, nr, np, acc);
        }
    } else { /* two loops, so that here[] stays in registers */
        for (int b = 0; b < nb; b++) {
            unpacked_block here[TILE_PANELS];
            for (int h = 0; h < np; h++) unpack_block(panels[h], qtype, b, &here[h]);
            const unpacked_block *u[TILE_PANELS] = {&here[0], &here[np - 1]};
            block_tile(xq, k, xs, xsums, b, u, qtype, nr, np, acc);
        }
    }
    if (gated) { /* silu_and_mul_f32's expression (ops.c), so the same values */
        for (int i = 0; i < nr; i++) {
            float g[PANEL], up[PANEL], *o = y + (int64_t)i * n;
            _mm512_storeu_ps(g, acc[i][0]);
            _mm512_storeu_ps(up, acc[i][1]);
#pragma omp simd
            for (int c = 0; c < PANEL; c++) o[c] = g[c] / (1.f + expf(-g[c])) * up[c];
        }
        return;
    }
    for (int h = 0; h < np && h * PANEL < cols; h++) {
        const int width = cols - h * PANEL < PANEL ? cols - h * PANEL : PANEL;
        const __mmask16 mask = (__mmask16)((1u << width) - 1);
        for (int i = 0; i < nr; i++) {
            __m512 v = acc[i][h];
            if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, bias + h * PANEL));
            if (residual)
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, residual + i * ldr + h * PANEL));
            _mm512_mask_storeu_ps(y + (int64_t)i * n + h * PANEL, mask, v);
        }
    }
}

#define TILES_UP_TO_4(TYPE, NP) \
    TILE(TYPE, NP, 1) TILE(TYPE, NP, 2) TILE(TYPE, NP, 3) TILE(TYPE, NP, 4)
#define TILES_ONE_PANEL(TYPE) \
    TILES_UP_TO_4(TYPE, 1) TILE(TYPE, 1, 5) TILE(TYPE, 1, 6) TILE(TYPE, 1, 7) TILE(TYPE, 1, 8)
#define TILES(TYPE) TILES_ONE_PANEL(TYPE) TILES_UP_TO_4(TYPE, 2) TILE(TYPE, 2, 5) TILE(TYPE, 2, 6)
#define TILES_Q6_K TILES_ONE_PANEL(Q6_K) TILES_UP_TO_4(Q6_K, 2)

#elif defined(REPACKED_AVX2)
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
    for (int at = 0; at < plane_bytes(bits) / 2; at += 64)
        _mm_prefetch((const char *)p + PREFETCH + at, _MM_HINT_T0);
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
        for (int h = 0; h < 2; h++) {
            __m256i s = _mm256_setzero_si256();
            for (int t = 4 * h; t < 4 * h + 4; t += 2) {
                __m256i pairs;
                if (qtype == Q8_0) { /* |w| * (x with w's sign): each pair below 2^15 */
                    pairs = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(u[t], _mm256_sign_epi8(x4(x + 4 * t), w[t])), ones);
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
    for (int side = 0; side < SIDES; side++)
        for (int b = 0; b < nb; b++) unpack_block(p, qtype, b, side, out + side * nb + b);
}

/* acc[0..nr) = rows 0..nr of x (quantized) times half `side` (8 columns) of a panel: its
 * blocks from `unpacked` (that half, unpacked once for a task's tiles), else unpacked here a
 * unit at a time (its header read once; unpack_block's struct per block spills on AVX2's 16
 * registers: 9% slower at 8 rows, measured). */
static inline __attribute__((always_inline)) void panel_tile(
    const int8_t *xq, int k, const float *xs, const int32_t *xsums, const uint8_t *p,
    const unpacked_block *unpacked, int qtype, int nr, int side, __m256 acc[MAX_ROWS]) {
    const int bits = panel_bits(qtype), planes = plane_bytes(bits), nb = k / BLOCK;
    const __m256 none = _mm256_setzero_ps();
    for (int i = 0; i < nr; i++) acc[i] = _mm256_setzero_ps();
    if (unpacked) {
        for (int b = 0; b < nb; b++) {
            const unpacked_block *u = unpacked + b;
            block_rows(xq, k, xs, xsums, b, u->w, u->u, qtype, nr, u->d, u->m, u->sc0,
                       u->sc1, acc);
        }
        return;
    }
    __m256i w[8], u[8];
    for (int b0 = 0; b0 < nb; b0 += unit_blocks(qtype)) { /* a unit */
        const __m256 d = half_scales(p + side * HALF * 2);
        const __m256 m = has_min(qtype) ? half_scales(p + 32 + side * HALF * 2)
                                        : _mm256_setzero_ps();
        const uint8_t *scales = p + (qtype == Q6_K ? 32 : 64) + side * HALF;
        const uint8_t *minima = scales + 8 * PANEL;
        p += header_bytes(qtype);
        for (int s = 0; s < unit_blocks(qtype); s++) {
            unpack(p + side * planes / 2, bits, w), p += planes;
            if (qtype == Q8_0)
                for (int t = 0; t < 8; t++) u[t] = _mm256_sign_epi8(w[t], w[t]);
            if (qtype == Q6_K) {
                const __m256 sc0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                    _mm_loadl_epi64((const __m128i *)(scales + 2 * s * PANEL))));
                const __m256 sc1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                    _mm_loadl_epi64((const __m128i *)(scales + (2 * s + 1) * PANEL))));
                block_rows(xq, k, xs, xsums, b0 + s, w, u, qtype, nr, d, m, sc0, sc1, acc);
            } else if (qtype == Q4_K || qtype == Q5_K) { /* as gguf_scales.h's, exact */
                const __m256 ds = _mm256_mul_ps(d, byte_scales(scales + s * PANEL));
                const __m256 ms = _mm256_sub_ps(
                    _mm256_setzero_ps(), _mm256_mul_ps(m, byte_scales(minima + s * PANEL)));
                block_rows(xq, k, xs, xsums, b0 + s, w, u, qtype, nr, ds, ms, none, none, acc);
            } else {
                block_rows(xq, k, xs, xsums, b0 + s, w, u, qtype, nr, d, m, none, none, acc);
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
    for (int side = 0; side < 2 && side * HALF < cols; side++) {
        __m256 acc[MAX_ROWS];
        panel_tile(xq, k, xs, xsums, p, unpacked ? unpacked + side * (k / BLOCK) : NULL,
                   qtype, nr, side, acc);
        const int c0 = side * HALF, width = cols - c0 < HALF ? cols - c0 : HALF;
        for (int i = 0; i < nr; i++) {
            float out[HALF];
            _mm256_storeu_ps(out, acc[i]);
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

#if defined(REPACKED_AVX512) || defined(REPACKED_AVX2)

/* y = x times the repacked weights [n, k] (+ bias) (+ residual); gated (TILE_PANELS 2, n / 2
 * whole panels): y [rows, n / 2] = silu(the first half's columns) * the second half's, each
 * tile a panel of the one and the matching panel of the other. */
static void repacked_linear(const float *x, int64_t ldx, const uint8_t *repacked, int qtype,
                            const float *bias, const float *residual, int64_t ldr, float *y,
                            int8_t *xq, float *xs, int32_t *xsums, int64_t rows, int k, int n,
                            int gated, int num_threads) {
    quantize_blocks(x, ldx, xq, xs, xsums, rows, k, num_threads);
    const int64_t npanels = (n + PANEL - 1) / PANEL;
    const int64_t panel_stride = gguf_repacked_bytes(qtype, k, n) / npanels;
    const int64_t chunks = (rows + CHUNK - 1) / CHUNK;
    /* panels a tile: TILE_PANELS unless every row fits one tile of one panel */
    const int np = rows <= MAX_ROWS && !gated ? 1 : TILE_PANELS;
    const int64_t tiles = (npanels + np - 1) / np;
    const int out_cols = gated ? n / 2 : n; /* y's row stride */
    /* rows a tile; a gated call of 7 or 8 rows as two tiles of 4, not one of 6 and a short one
     * (0.77-0.84x the unfused way's time at Qwen2.5-0.5B's gate/up) */
    const int step = gated && rows > 6 && rows <= MAX_ROWS ? 4 : tile_rows(qtype, np);
    const int nb = k / BLOCK;
#pragma omp parallel num_threads(num_threads) if (rows * (int64_t)n * k > 1 << 18)
    {
        /* The buffer of the tasks that unpack their panels once (a panel's blocks: 768 bytes
         * each with AVX-512, 2 x 640 with AVX2; L1 or L2) */
        unpacked_block *buffer =
            buffered(rows) ? aligned_alloc(64, np * SIDES * nb * sizeof(unpacked_block)) : NULL;
        /* Tasks go tile by tile, each tile's chunks of rows in turn, so a thread unpacks a
         * tile's panels once for all rows (by chunks first, each panel was unpacked once per
         * 64 rows: 5-7% of a 512-row prefill's time) */
        int64_t in_buffer = -1; /* the tile whose panels the buffer holds */
#pragma omp for collapse(2) schedule(static)
        for (int64_t ti = 0; ti < tiles; ti++) {
            for (int64_t ch = 0; ch < chunks; ch++) {
                const int64_t c0 = ti * (gated ? 1 : np) * PANEL;
                const int64_t end = rows < (ch + 1) * CHUNK ? rows : (ch + 1) * CHUNK;
                const int cols = gated ? PANEL : n - c0 < np * PANEL ? (int)(n - c0) : np * PANEL;
                const uint8_t *panel = repacked + c0 / PANEL * panel_stride;
                const int64_t second = gated           ? tiles * panel_stride
                                       : cols > PANEL ? panel_stride
                                                      : 0; /* a lone last panel twice */
                const unpacked_block *unpacked = NULL;
                if (buffer && buffered(end - ch * CHUNK)) {
                    if (in_buffer != ti)
                        for (int h = 0; h < np; h++)
                            unpack_panel(panel + h * second, qtype, nb,
                                         buffer + (int64_t)h * SIDES * nb);
                    in_buffer = ti;
                    unpacked = buffer;
                }
                for (int64_t r = ch * CHUNK; r < end; r += step) {
                    const int nr = end - r < step ? (int)(end - r) : step;
                    const int8_t *xr = xq + r * k;
                    const float *sx = xs + r * nb;
                    const int32_t *sums = xsums + r * nb * 2;
                    const float *b = bias ? bias + c0 : NULL;
                    const float *res = residual ? residual + r * ldr + c0 : NULL;
                    float *out = y + r * (int64_t)out_cols + c0;
                    /* one inlined copy per panel count, block type and row count */
                    switch ((np - 1) * 256 + qtype * 16 + nr) {
#define TILE(TYPE, NP, NR)                                                                    \
    case (NP - 1) * 256 + TYPE * 16 + NR:                                                     \
        tile(xr, k, sx, sums, panel, second, unpacked, TYPE, NR, NP, gated, b, res, ldr, out, \
             out_cols, cols);                                                                 \
        break;
                        TILES(Q4_0) TILES(Q4_1) TILES(Q5_0) TILES(Q5_1) TILES(Q8_0)
                        TILES(Q4_K) TILES(Q5_K) TILES_Q6_K
#undef TILE
                    }
                }
            }
        }
        free(buffer);
    }
}

#endif

int gguf_repacked_linear_f32(const float *x, int64_t ldx, const uint8_t *repacked, int qtype,
                             const float *bias, const float *residual, int64_t ldr, float *y,
                             int8_t *xq, float *xs, int32_t *xsums, int64_t rows, int k, int n,
                             int num_threads) {
    if (!gguf_repacked_bytes(qtype, k, n)) return -1;
#if defined(REPACKED_AVX512) || defined(REPACKED_AVX2)
    repacked_linear(x, ldx, repacked, qtype, bias, residual, ldr, y, xq, xs, xsums, rows, k, n,
                    0, num_threads);
#else
    (void)x, (void)ldx, (void)repacked, (void)bias, (void)residual, (void)ldr, (void)y;
    (void)xq, (void)xs, (void)xsums, (void)rows, (void)num_threads;
#endif
    return 0;
}

int gguf_repacked_silu_mul_supported(void) {
#if defined(REPACKED_AVX512)
    return 1;
#else
    return 0;
#endif
}

int gguf_repacked_silu_mul_f32(const float *x, int64_t ldx, const uint8_t *repacked, int qtype,
                               float *y, int8_t *xq, float *xs, int32_t *xsums, int64_t rows,
                               int k, int n, int num_threads) {
    if (!gguf_repacked_silu_mul_supported() || !gguf_repacked_bytes(qtype, k, n) ||
        n % (2 * PANEL))
        return -1;
#if defined(REPACKED_AVX512)
    repacked_linear(x, ldx, repacked, qtype, NULL, NULL, 0, y, xq, xs, xsums, rows, k, n, 1,
                    num_threads);
#else
    (void)x, (void)ldx, (void)repacked, (void)y, (void)xq, (void)xs, (void)xsums, (void)rows;
    (void)num_threads;
#endif
    return 0;
}
