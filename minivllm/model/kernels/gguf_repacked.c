/* The linear layer over GGUF weights repacked at load (gguf_repacked.h's layout,
 * gguf_repack.c; model/linear/gguf.py). The arithmetic of gguf_gemm.c: x quantized per row and
 * block of 32 to int8 (gguf_activations.h), each block's integer dot product exact in
 * int32, scaled in fp32; but one instruction serves many columns at once:
 *
 *   AVX-512 VNNI: vpdpbusd(acc, W, broadcast(4 bytes of x)): lane c += the 4 products of
 *                 column c, 16 columns;
 *   AVX2:         vpmaddubsw + vpmaddwd, the same for 8 columns (the int16 pairs of a
 *                 4-bit block's 8 quads, a 5-bit one's 4 and Q6_K's 2 summed first, below
 *                 2^15; Q8_0 signed, with llama.cpp's sign trick);
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
 * hardware prefetcher would still be ramping up at its end). The tiles of each ISA are
 * gguf_repacked_avx512.h's and gguf_repacked_avx2.h's; this file is their loop. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_activations.h"
#include "gguf_repacked.h"
#include "kernels.h"

#define CHUNK 64 /* rows of x per task: a tile of few columns still splits among threads */

#if defined(REPACKED_AVX512)
#include "gguf_repacked_avx512.h"
#elif defined(REPACKED_AVX2)
#include "gguf_repacked_avx2.h"
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
    const int64_t panel_stride = repacked_bytes(qtype, k, n) / npanels;
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
    if (!repacked_bytes(qtype, k, n)) return -1;
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
    if (!gguf_repacked_silu_mul_supported() || !repacked_bytes(qtype, k, n) ||
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
