/* gguf_repacked.c's tiles with AVX-512 VNNI: a panel's 16 columns in one zmm, vpdpbusd.
 * What gguf_repacked.c's loop calls: unpacked_block, unpack_panel, tile, SIDES,
 * TILE_PANELS, MAX_ROWS, tile_rows, buffered, and the TILES list of tiles it inlines. */
#ifndef MINIVLLM_GGUF_REPACKED_AVX512_H
#define MINIVLLM_GGUF_REPACKED_AVX512_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_activations.h"
#include "gguf_repacked.h"

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

#endif
