/* Linear layer over GGUF weight blocks as the file stores them (model/linear/gguf.py):
 *   y[r][c] = sum_b sx[r][b] * (d[c][b] * S(xq[r, b], wq[c, b]) + m[c][b] * M(xq[r, b]))
 *             (+ bias) (+ residual)
 * where b runs over the blocks of 32 input values, x is quantized here per row and block of
 * 32 to int8 in [-127, 127] with scale sx (llama.cpp's q8_0 activations; with each half's
 * sum, its q8_1), wq are the block's integers, d its scale and m its minimum (fp32, read
 * from the block's fp16 and 6-bit fields: gguf_scales.h):
 *   S = xq . wq, or for the types with two integer scales per block, one per 16 values
 *       (Q2_K, Q3_K, Q6_K), sc0 * (first 16 products) + sc1 * (last 16);
 *   M = sum(xq) for the types with a minimum (Q4_1, Q5_1, Q4_K, Q5_K), for Q2_K
 *       m0 * (sum of the first 16 xq) + m1 * (the last 16); 0 for the symmetric types.
 * S and M are exact in int32 (and in fp32: |S| < 2^24), then scaled and accumulated in fp32.
 *
 * The block types (`blocks` is the file's bytes, n rows of k / 32 blocks, or k / 256 super-
 * blocks for the K types; a nibble / bit field is value j of a block at byte j of its
 * field, low bits first, unless said otherwise):
 *   Q4_0 (18 bytes): fp16 d, 16 bytes of nibbles (low: values 0..15, high: 16..31);
 *        wq = nibble - 8;
 *   Q4_1 (20): fp16 d, fp16 m, nibbles as Q4_0's; wq = nibble;
 *   Q5_0 (22): fp16 d, 32 bits of 5th bits (value j: bit j), nibbles as Q4_0's;
 *        wq = nibble + 16 * bit - 16;
 *   Q5_1 (24): fp16 d, fp16 m, then as Q5_0; wq = nibble + 16 * bit;
 *   Q8_0 (34): fp16 d, 32 int8; wq = int8;
 *   Q2_K (84, super-block of 8 blocks s): 16 bytes of 4-bit scales (low) and minima (high)
 *        per 16 values, 64 bytes of 2-bit crumbs (block s: bits 2 (s & 3) of bytes
 *        32 (s >> 2) + j), fp16 d, fp16 dmin; wq = crumb, scale d, minimum -dmin (times m);
 *   Q3_K (110): 32 bytes of high bits (block s: bit s of byte j), 64 bytes of crumbs as
 *        Q2_K's, 12 bytes of 6-bit scales (sc - 32), fp16 d; wq = crumb + 4 * bit - 4;
 *   Q4_K (144): fp16 d, fp16 dmin, 12 bytes of 6-bit scales and minima, 4 x 32 bytes of
 *        nibbles (block s: the low (s even) or high nibbles of bytes 32 (s >> 1) + j);
 *        wq = nibble, scale d * sc, minimum -dmin * m;
 *   Q5_K (176): fp16 d, fp16 dmin, 12 bytes as Q4_K's, 32 bytes of 5th bits (block s: bit
 *        s of byte j), nibbles as Q4_K's; wq = nibble + 16 * bit;
 *   Q6_K (210): 128 bytes of low nibbles (block s: the low (s & 2 clear) or high nibbles
 *        of bytes 64 (s >> 2) + 32 (s & 1) + j), 64 bytes of crumbs (bits 2 (s & 3) of
 *        bytes 128 + 32 (s >> 2) + j), 16 int8 scales per 16 values, fp16 d;
 *        wq = nibble + 16 * crumb - 32, scale d.
 * The kernel reads nothing but the blocks: a decode step streams the file's bytes.
 *
 * The variants, picked by the compiler's macros (build.py builds one library per ISA level):
 *   - AVX512-VNNI (with VL) / AVX-VNNI: vpdpbusd on 256 bits (one block): the types with a
 *     minimum have unsigned wq as they are; the symmetric ones go as |wq| unsigned times x
 *     carrying wq's sign; the two integer scales multiply the int32 lanes of their half;
 *     with AVX-512 (BW, VL), Q5_0 / Q5_1's 32 fifth bits are the byte mask of one masked add;
 *   - AVX2: the same with vpmaddubsw into int16 pairs (at most 2 * 128 * 127, no
 *     saturation) and vpmaddwd to int32 (llama.cpp's sign trick);
 *   - otherwise: the same sums in plain C.
 * All produce the same integer block sums; only the order of the fp32 accumulation differs
 * (8 lanes summed at the end on x86).
 *
 * A tile is up to ROWS input rows against one weight row: a block's weights are unpacked
 * once for all of them. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gguf_activations.h"
#include "gguf_unpack.h"
#include "kernels.h"

#define ROWS 4 /* input rows per tile */
#define PREFETCH_ROWS 4 /* weight rows ahead */

#if defined(__AVX2__)
/* 8 int32 partial sums of u . x (lane i: bytes 4i..4i+3), u unsigned, x signed (each pair
 * within int16 for AVX2: callers keep u <= 128, x in [-127, 127]). */
static inline __m256i dot_unsigned(__m256i u, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
#endif
}

static inline float hsum(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

/* out[i] = the tile's dot products of `nr` input rows (xq rows k apart) with one weight
 * row. Inlined per row count and block type. */
static inline __attribute__((always_inline)) void tile(const int8_t *xq, int k,
                                                       const float *xs, const int32_t *xsums,
                                                       const uint8_t *wrow, int nb, int qtype,
                                                       int nr, float out[ROWS]) {
    __m256 acc[ROWS];
    float mins[ROWS], ds[8], ms[8];
    for (int i = 0; i < nr; i++) acc[i] = _mm256_setzero_ps(), mins[i] = 0.f;
    for (int b0 = 0; b0 < nb; b0 += unit_blocks(qtype)) { /* a unit at a time */
        const uint8_t *unit = wrow + (int64_t)(b0 / unit_blocks(qtype)) * unit_bytes(qtype);
        gguf_unit_scales(unit, qtype, ds, ms);
        for (int s = 0; s < unit_blocks(qtype); s++) {
            const int b = b0 + s;
            const float d = ds[s], dm = ms[s];
            const __m256i w = block_bytes(unit, s, qtype);
            /* the weights unsigned: as they are with a minimum, else |w| (|-128|: 128 as u8) */
            const __m256i u = has_min(qtype) ? w : _mm256_sign_epi8(w, w);
            int32_t sc[2] = {1, 1}, m[2] = {1, 1};
            if (has_sub_scales(qtype)) sub_scales(unit, s, qtype, sc, m);
            const __m256i halves = _mm256_setr_epi32(sc[0], sc[0], sc[0], sc[0], sc[1], sc[1],
                                                     sc[1], sc[1]);
            for (int i = 0; i < nr; i++) {
                __m256i x =
                    _mm256_loadu_si256((const __m256i *)(xq + (int64_t)i * k + b * BLOCK));
                if (!has_min(qtype)) x = _mm256_sign_epi8(x, w); /* 0 where w is */
                __m256i dot = dot_unsigned(u, x);
                if (has_sub_scales(qtype)) dot = _mm256_mullo_epi32(dot, halves);
                const float sx = xs[i * nb + b];
                acc[i] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(sx * d), acc[i]);
                if (has_min(qtype)) {
                    const int32_t *half_sums = xsums + (int64_t)(i * nb + b) * 2;
                    mins[i] = fmaf(sx * dm, (float)(m[0] * half_sums[0] + m[1] * half_sums[1]),
                                   mins[i]);
                }
            }
        }
    }
    for (int i = 0; i < nr; i++) out[i] = hsum(acc[i]) + mins[i];
}

#else /* another architecture, or x86 below AVX2 */

static inline void tile(const int8_t *xq, int k, const float *xs, const int32_t *xsums,
                        const uint8_t *wrow, int nb, int qtype, int nr, float out[ROWS]) {
    for (int i = 0; i < nr; i++) {
        float acc = 0.f;
        float ds[8], ms[8];
        for (int b = 0; b < nb; b++) {
            const int s = b % unit_blocks(qtype);
            const uint8_t *unit = wrow + (int64_t)(b / unit_blocks(qtype)) * unit_bytes(qtype);
            if (s == 0) gguf_unit_scales(unit, qtype, ds, ms);
            const float d = ds[s], dm = ms[s];
            int32_t sc[2] = {1, 1}, m[2] = {1, 1}, dot[2] = {0, 0};
            if (has_sub_scales(qtype)) sub_scales(unit, s, qtype, sc, m);
            for (int j = 0; j < BLOCK; j++)
                dot[j >> 4] += block_value(unit, s, j, qtype) * xq[(int64_t)i * k + b * BLOCK + j];
            const float sx = xs[i * nb + b];
            acc = fmaf((float)(sc[0] * dot[0] + sc[1] * dot[1]), sx * d, acc);
            if (has_min(qtype)) {
                const int32_t *half_sums = xsums + (int64_t)(i * nb + b) * 2;
                acc = fmaf(sx * dm, (float)(m[0] * half_sums[0] + m[1] * half_sums[1]), acc);
            }
        }
        out[i] = acc;
    }
}
#endif

/* x [rows, k] fp32 (row stride ldx), k a multiple of 32; blocks as above for n output
 * columns; bias [n] or NULL; residual [rows, n] (row stride ldr) or
 * NULL; y [rows, n] contiguous. xq: rows * k bytes, xs: rows * k / 32 floats and xsums:
 * rows * k / 16 ints, for the quantized rows. Returns 0, or -1 for a block type it does not
 * read (or a K type with k not a multiple of 256). */
int gguf_linear_f32(const float *x, int64_t ldx, const uint8_t *blocks, int qtype,
                    const float *bias, const float *residual, int64_t ldr, float *y, int8_t *xq,
                    float *xs, int32_t *xsums, int64_t rows, int k, int n, int num_threads) {
    const int unit_values = is_k_type(qtype) ? 256 : BLOCK;
    if (!unit_bytes(qtype) || k % unit_values) return -1;
    const int nb = k / BLOCK;
    const int64_t row_bytes = (int64_t)(k / unit_values) * unit_bytes(qtype);
    quantize_blocks(x, ldx, xq, xs, xsums, rows, k, num_threads);
    /* Columns split between the threads; a weight row (k / 32 blocks, under 2 KiB for
     * k <= 2048 in Q8_0) stays in L1 while every input row passes over it. */
#pragma omp parallel for num_threads(num_threads) schedule(static) \
    if (rows * (int64_t)n * k > 1 << 18)
    for (int c = 0; c < n; c++) {
        const uint8_t *wrow = blocks + c * row_bytes;
        /* The row PREFETCH_ROWS ahead asked for now: one core's stream is bound by how many
         * misses it has in flight, and the hardware prefetcher stops at each 4 KiB page. */
        if (c + PREFETCH_ROWS < n)
            for (int64_t at = 0; at < row_bytes; at += 64)
                __builtin_prefetch(wrow + PREFETCH_ROWS * row_bytes + at, 0, 3);
        for (int64_t r = 0; r < rows; r += ROWS) {
            const int nr = rows - r < ROWS ? (int)(rows - r) : ROWS;
            const int8_t *xr = xq + r * k;
            const float *sx = xs + r * nb;
            const int32_t *sums = xsums + r * nb * 2;
            float out[ROWS];
            switch (qtype * 8 + nr) { /* one inlined copy per block type and row count */
#define TILE(TYPE, NR)                                                  \
    case TYPE * 8 + NR:                                                 \
        tile(xr, k, sx, sums, wrow, nb, TYPE, NR, out); \
        break;
#define TILES(TYPE) TILE(TYPE, 1) TILE(TYPE, 2) TILE(TYPE, 3) TILE(TYPE, 4)
                TILES(Q4_0) TILES(Q4_1) TILES(Q5_0) TILES(Q5_1) TILES(Q8_0)
                TILES(Q2_K) TILES(Q3_K) TILES(Q4_K) TILES(Q5_K) TILES(Q6_K)
#undef TILES
#undef TILE
            }
            for (int i = 0; i < nr; i++) {
                float v = out[i];
                if (bias) v += bias[c];
                if (residual) v += residual[(r + i) * ldr + c];
                y[(r + i) * (int64_t)n + c] = v;
            }
        }
    }
    return 0;
}
