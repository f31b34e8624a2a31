/* GGUF weights repacked once at load into panels of 16 output columns, and the linear layer
 * over them (linear_gguf.py; llama.cpp repacks Q4_0 / Q4_K into interleaved rows for the
 * same reason — this layout is our own). Same arithmetic as gguf_gemm.c: x quantized per row
 * and block of 32 to int8 (gguf_activations.h), each block's integer dot product exact in
 * int32, scaled in fp32; but one instruction serves 16 columns at once:
 *
 *   vpdpbusd(acc, W, broadcast(4 bytes of x)): lane c += the 4 products of column c,
 *
 * so a block of 32 values costs 8 of them for 16 columns and a row of x, where gguf_gemm.c
 * spends one per column and then sums lanes. No horizontal sums, the 16 columns' scales
 * converted by one vcvtph2ps, and a block unpacked once for up to MAX_ROWS rows of x.
 *
 * Each weight is stored unsigned, q = wq + offset (Q4_0: 8, Q5_0: 16, Q8_0: 128, Q6_K: 32,
 * the types with a minimum: 0); the offset comes back exactly as offset * sum(x block)
 * (the sums gguf_activations.h keeps). A panel is 16 columns' units (a block of 32, or a K
 * type's super-block of 256) in order along K, each unit:
 *   fp16 d [16]; Q4_1 / Q5_1: fp16 m [16]; Q4_K / Q5_K: fp16 dmin [16], then their 6-bit
 *   scales and minima as bytes, [8 blocks][16]; Q6_K: its int8 scales, [16 halves][16];
 *   then each block's planes (bits: 4, Q4_x; 5, Q5_x; 6, Q6_K; 8, Q8_0):
 *     8 bits: 8 quads x 64 bytes, byte 4c + j of quad t = q of column c, value 4t + j;
 *     else 4 x 64 bytes of nibbles, byte 4c + j of chunk h: low nibble value 4h + j, high
 *     nibble value 4(h + 4) + j of column c; then bits - 4 planes of the next bits
 *     (bit 4, then 5), each 8 quads x 64 bits (bit 4c + j as above).
 * That is the file's own bytes per weight (Q4_K, Q5_K: +1/64 byte, their 6-bit scales as
 * bytes), so a decode step reads what the file stores, as two contiguous streams (one per
 * thread).
 * Padding columns past n have d = 0 and contribute nothing.
 *
 * Every output is its blocks' terms accumulated in K order whatever the number of rows or
 * how they are tiled: a row's result does not depend on the batch it runs in.
 *
 * Only with AVX-512 VNNI (+ BW, VL); elsewhere the functions report it and gguf_gemm.c runs. */
#include <stdint.h>
#include <string.h>

#include "gguf_activations.h"
#include "gguf_unpack.h"
#include "kernels.h"

#define PANEL 16   /* output columns per panel: the int32 / fp32 lanes of a zmm */
#define MAX_ROWS 8 /* rows of x per tile */
#define CHUNK 64   /* rows of x per task, so a long prompt's int8 rows stay in L2 */
#define PREFETCH 3072 /* bytes ahead in the stream (1-4 KiB measured: 3 the best) */

static inline int panel_bits(int qtype) {
    switch (qtype) {
    case Q4_0: case Q4_1: case Q4_K: return 4;
    case Q5_0: case Q5_1: case Q5_K: return 5;
    case Q6_K: return 6;
    case Q8_0: return 8;
    default: return 0; /* Q2_K, Q3_K: gguf_gemm.c */
    }
}

static inline int panel_offset(int qtype) {
    switch (qtype) {
    case Q4_0: return 8;
    case Q5_0: return 16;
    case Q8_0: return 128;
    case Q6_K: return 32;
    default: return 0;
    }
}

static inline int plane_bytes(int bits) { return bits == 8 ? 8 * 64 : 4 * 64 + (bits - 4) * 64; }

/* Bytes of a unit's header (scales) in a panel */
static inline int header_bytes(int qtype) {
    switch (qtype) {
    case Q4_1: case Q5_1: return 64;
    case Q4_K: case Q5_K: return 64 + 2 * 8 * PANEL;
    case Q6_K: return 32 + 16 * PANEL;
    default: return 32;
    }
}

static inline int64_t panel_unit_bytes(int qtype) {
    return header_bytes(qtype) + (int64_t)unit_blocks(qtype) * plane_bytes(panel_bits(qtype));
}

int64_t gguf_repacked_bytes(int qtype, int k, int n) {
    const int unit_values = BLOCK * unit_blocks(qtype);
    if (!panel_bits(qtype) || !unit_bytes(qtype) || k % unit_values) return 0;
    return (int64_t)((n + PANEL - 1) / PANEL) * (k / unit_values) * panel_unit_bytes(qtype);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define REPACKED_BUILT

/* One unit of 16 columns (c0.. of n) from the file's blocks into its panel bytes `out`. */
static void repack_unit(const uint8_t *blocks, int64_t row_bytes, int n, int64_t c0, int64_t u,
                        int qtype, uint8_t *out) {
    const int nblocks = unit_blocks(qtype), bits = panel_bits(qtype);
    uint8_t q[PANEL][256];
    uint16_t d[PANEL], m[PANEL];
    uint8_t sc[PANEL][16], mn[PANEL][8];
    memset(q, 0, sizeof q), memset(d, 0, sizeof d), memset(m, 0, sizeof m);
    memset(sc, 0, sizeof sc), memset(mn, 0, sizeof mn);
    for (int c = 0; c < PANEL && c0 + c < n; c++) {
        const uint8_t *unit = blocks + (c0 + c) * row_bytes + u * unit_bytes(qtype);
        for (int s = 0; s < nblocks; s++) {
            int8_t wq[BLOCK];
            _mm256_storeu_si256((__m256i *)wq, block_bytes(unit, s, qtype));
            for (int j = 0; j < BLOCK; j++)
                q[c][s * BLOCK + j] = (uint8_t)(wq[j] + panel_offset(qtype));
        }
        const int d_at = qtype == Q6_K ? 208 : 0;
        memcpy(&d[c], unit + d_at, 2);
        if (has_min(qtype)) memcpy(&m[c], unit + 2, 2); /* m, or the K types' dmin */
        if (qtype == Q6_K)
            for (int j = 0; j < 16; j++) sc[c][j] = unit[192 + j];
        if (qtype == Q4_K || qtype == Q5_K)
            for (int s = 0; s < 8; s++) {
                int scale, minimum;
                gguf_k_scale_min(unit, s, &scale, &minimum);
                sc[c][s] = (uint8_t)scale, mn[c][s] = (uint8_t)minimum;
            }
    }
    uint8_t *p = out;
    memcpy(p, d, sizeof d), p += sizeof d;
    if (has_min(qtype)) memcpy(p, m, sizeof m), p += sizeof m;
    const int scales = qtype == Q6_K ? 16 : (qtype == Q4_K || qtype == Q5_K) ? 8 : 0;
    for (int s = 0; s < scales; s++)
        for (int c = 0; c < PANEL; c++) *p++ = sc[c][s];
    if (qtype == Q4_K || qtype == Q5_K)
        for (int s = 0; s < 8; s++)
            for (int c = 0; c < PANEL; c++) *p++ = mn[c][s];
    for (int s = 0; s < nblocks; s++) {
        const int v0 = s * BLOCK;
        if (bits == 8) {
            for (int t = 0; t < 8; t++)
                for (int c = 0; c < PANEL; c++)
                    for (int j = 0; j < 4; j++) *p++ = q[c][v0 + 4 * t + j];
            continue;
        }
        for (int h = 0; h < 4; h++)
            for (int c = 0; c < PANEL; c++)
                for (int j = 0; j < 4; j++)
                    *p++ = (q[c][v0 + 4 * h + j] & 15) | (q[c][v0 + 4 * (h + 4) + j] & 15) << 4;
        for (int bit = 4; bit < bits; bit++)
            for (int t = 0; t < 8; t++) {
                uint64_t mask = 0;
                for (int c = 0; c < PANEL; c++)
                    for (int j = 0; j < 4; j++)
                        mask |= (uint64_t)((q[c][v0 + 4 * t + j] >> bit) & 1) << (4 * c + j);
                memcpy(p, &mask, 8), p += 8;
            }
    }
}

static void repack(const uint8_t *blocks, int qtype, int k, int n, uint8_t *panels,
                   int num_threads) {
    const int unit_values = BLOCK * unit_blocks(qtype);
    const int64_t units = k / unit_values, row_bytes = units * unit_bytes(qtype);
    const int64_t npanels = (n + PANEL - 1) / PANEL, bytes = panel_unit_bytes(qtype);
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t pi = 0; pi < npanels; pi++)
        for (int64_t u = 0; u < units; u++)
            repack_unit(blocks, row_bytes, n, pi * PANEL, u, qtype,
                        panels + (pi * units + u) * bytes);
}

/* A block's 8 quads of 16 columns x 4 unsigned values from its planes at p; the bytes
 * PREFETCH ahead asked for now (a matrix is a short stream: the hardware prefetcher would
 * still be ramping up at its end). */
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

/* acc[i] += block b of row i of x times the unpacked block w (16 columns): scale d
 * (Q6_K: times the int8 half scales sc0 / sc1), minimum mins (the types with one). */
static inline __attribute__((always_inline)) void block_rows(
    const int8_t *xq, int k, const float *xs, const int32_t *xsums, int b, const __m512i w[8],
    int qtype, int nr, __m512 d, __m512 mins, __m512i sc0, __m512i sc1, __m512 acc[MAX_ROWS]) {
    const int nb = k / BLOCK;
    for (int i = 0; i < nr; i++) {
        const int8_t *x = xq + (int64_t)i * k + b * BLOCK;
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int t = 0; t < 4; t++) { /* two chains: the halves of the block */
            s0 = _mm512_dpbusd_epi32(s0, w[t], x4(x + 4 * t));
            s1 = _mm512_dpbusd_epi32(s1, w[t + 4], x4(x + 16 + 4 * t));
        }
        const int32_t *half = xsums + ((int64_t)i * nb + b) * 2;
        const float sx = xs[(int64_t)i * nb + b];
        __m512i s;
        if (qtype == Q6_K) {
            s = _mm512_add_epi32(
                _mm512_mullo_epi32(_mm512_sub_epi32(s0, _mm512_set1_epi32(32 * half[0])), sc0),
                _mm512_mullo_epi32(_mm512_sub_epi32(s1, _mm512_set1_epi32(32 * half[1])), sc1));
        } else {
            s = _mm512_add_epi32(s0, s1);
            if (panel_offset(qtype))
                s = _mm512_sub_epi32(
                    s, _mm512_set1_epi32(panel_offset(qtype) * (half[0] + half[1])));
        }
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(sx)),
                                 acc[i]);
        if (has_min(qtype))
            acc[i] = _mm512_fmadd_ps(mins, _mm512_set1_ps(sx * (float)(half[0] + half[1])),
                                     acc[i]);
    }
}

/* acc[0..nr) = rows 0..nr of x (quantized) times one panel (16 columns). */
static inline __attribute__((always_inline)) void panel_tile(
    const int8_t *xq, int k, const float *xs, const int32_t *xsums, const uint8_t *p, int qtype,
    int nr, __m512 acc[MAX_ROWS]) {
    const int bits = panel_bits(qtype), planes = plane_bytes(bits), nb = k / BLOCK;
    const __m512i none = _mm512_setzero_si512();
    __m512i w[8];
    for (int i = 0; i < nr; i++) acc[i] = _mm512_setzero_ps();
    if (!is_k_type(qtype)) {
        for (int b = 0; b < nb; b++) {
            const __m512 d = half_scales(p);
            const __m512 m = has_min(qtype) ? half_scales(p + 32) : _mm512_setzero_ps();
            p += header_bytes(qtype);
            unpack(p, bits, w), p += planes;
            block_rows(xq, k, xs, xsums, b, w, qtype, nr, d, m, none, none, acc);
        }
        return;
    }
    for (int b0 = 0; b0 < nb; b0 += 8) { /* a super-block */
        const __m512 d = half_scales(p);
        const __m512 dmin = qtype == Q6_K ? _mm512_setzero_ps() : half_scales(p + 32);
        const uint8_t *scales = p + (qtype == Q6_K ? 32 : 64), *minima = scales + 8 * PANEL;
        p += header_bytes(qtype);
        for (int s = 0; s < 8; s++) {
            unpack(p, bits, w), p += planes;
            if (qtype == Q6_K) {
                const __m512i sc0 = _mm512_cvtepi8_epi32(
                    _mm_loadu_si128((const __m128i *)(scales + 2 * s * PANEL)));
                const __m512i sc1 = _mm512_cvtepi8_epi32(
                    _mm_loadu_si128((const __m128i *)(scales + (2 * s + 1) * PANEL)));
                block_rows(xq, k, xs, xsums, b0 + s, w, qtype, nr, d, dmin, sc0, sc1, acc);
            } else { /* d * scale and -(dmin * minimum), exact in fp32 as gguf_scales.h's */
                const __m512 ds = _mm512_mul_ps(d, byte_scales(scales + s * PANEL));
                const __m512 ms = _mm512_sub_ps(
                    _mm512_setzero_ps(), _mm512_mul_ps(dmin, byte_scales(minima + s * PANEL)));
                block_rows(xq, k, xs, xsums, b0 + s, w, qtype, nr, ds, ms, none, none, acc);
            }
        }
    }
}

static void repacked_linear(const float *x, int64_t ldx, const uint8_t *panels, int qtype,
                          const float *bias, const float *residual, int64_t ldr, float *y,
                          int8_t *xq, float *xs, int32_t *xsums, int64_t rows, int k, int n,
                          int num_threads) {
    const int64_t bytes = gguf_repacked_bytes(qtype, k, n);
    quantize_blocks(x, ldx, xq, xs, xsums, rows, k, num_threads);
    const int64_t npanels = (n + PANEL - 1) / PANEL, panel_stride = bytes / npanels;
    const int64_t chunks = (rows + CHUNK - 1) / CHUNK;
    const int nb = k / BLOCK;
#pragma omp parallel for collapse(2) num_threads(num_threads) schedule(static) \
    if (rows * (int64_t)n * k > 1 << 18)
    for (int64_t ch = 0; ch < chunks; ch++) {
        for (int64_t pi = 0; pi < npanels; pi++) {
            const int64_t c0 = pi * PANEL, end = rows < (ch + 1) * CHUNK ? rows : (ch + 1) * CHUNK;
            const __mmask16 cols = n - c0 >= PANEL ? 0xFFFF : (__mmask16)((1u << (n - c0)) - 1);
            for (int64_t r = ch * CHUNK; r < end; r += MAX_ROWS) {
                const int nr = end - r < MAX_ROWS ? (int)(end - r) : MAX_ROWS;
                const int8_t *xr = xq + r * k;
                const float *sx = xs + r * nb;
                const int32_t *sums = xsums + r * nb * 2;
                const uint8_t *panel = panels + pi * panel_stride;
                __m512 acc[MAX_ROWS];
                switch (qtype * 16 + nr) { /* one inlined copy per block type and row count */
#define TILE(TYPE, NR)                                            \
    case TYPE * 16 + NR:                                          \
        panel_tile(xr, k, sx, sums, panel, TYPE, NR, acc); \
        break;
#define TILES(TYPE) \
    TILE(TYPE, 1) TILE(TYPE, 2) TILE(TYPE, 3) TILE(TYPE, 4) \
    TILE(TYPE, 5) TILE(TYPE, 6) TILE(TYPE, 7) TILE(TYPE, 8)
                    TILES(Q4_0) TILES(Q4_1) TILES(Q5_0) TILES(Q5_1) TILES(Q8_0)
                    TILES(Q4_K) TILES(Q5_K) TILES(Q6_K)
#undef TILES
#undef TILE
                }
                for (int i = 0; i < nr; i++) {
                    __m512 v = acc[i];
                    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(cols, bias + c0));
                    if (residual)
                        v = _mm512_add_ps(
                            v, _mm512_maskz_loadu_ps(cols, residual + (r + i) * ldr + c0));
                    _mm512_mask_storeu_ps(y + (r + i) * (int64_t)n + c0, cols, v);
                }
            }
        }
    }
}

#endif

int gguf_repacked_supported(void) {
#ifdef REPACKED_BUILT
    return 1;
#else /* gguf_gemm.c reads the blocks as stored */
    return 0;
#endif
}

int gguf_repack(const uint8_t *blocks, int qtype, int k, int n, uint8_t *repacked,
                int num_threads) {
    if (!gguf_repacked_supported() || !gguf_repacked_bytes(qtype, k, n)) return -1;
#ifdef REPACKED_BUILT
    repack(blocks, qtype, k, n, repacked, num_threads);
#else
    (void)blocks, (void)repacked, (void)num_threads;
#endif
    return 0;
}

int gguf_repacked_linear_f32(const float *x, int64_t ldx, const uint8_t *repacked, int qtype,
                           const float *bias, const float *residual, int64_t ldr, float *y,
                           int8_t *xq, float *xs, int32_t *xsums, int64_t rows, int k, int n,
                           int num_threads) {
    if (!gguf_repacked_supported() || !gguf_repacked_bytes(qtype, k, n)) return -1;
#ifdef REPACKED_BUILT
    repacked_linear(x, ldx, repacked, qtype, bias, residual, ldr, y, xq, xs, xsums, rows, k, n,
                  num_threads);
#else
    (void)x, (void)ldx, (void)repacked, (void)bias, (void)residual, (void)ldr, (void)y;
    (void)xq, (void)xs, (void)xsums, (void)rows, (void)num_threads;
#endif
    return 0;
}
