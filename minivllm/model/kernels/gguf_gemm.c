/* Linear layer over GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K weight blocks as the file stores them
 * (linear_gguf.py):
 *   y[r][c] = sum_b sx[r][b] * (d[c][b] * (xq[r, b] . wq[c, b]) + m[c][b] * sum(xq[r, b]))
 *             (+ bias) (+ residual)
 * where b runs over the blocks of 32 input values, wq are the block's integers (Q8_0: int8;
 * Q4_0: nibble - 8; Q4_1, Q4_K: nibble, 0..15), d its scale and m its minimum (Q4_1, Q4_K:
 * their values are d * nibble + m; 0 for the others), and x is quantized here per row and
 * block of 32 to int8 in [-127, 127] (llama.cpp's q8_0 activations; for Q4_1 and Q4_K its
 * q8_1, which also carries each block's sum). Each block's dot product is exact in int32, converted to fp32
 * and accumulated with the scales.
 *
 * Weights: `blocks` is the file's bytes, n rows of k / 32 blocks of `block_bytes` (34 for
 * Q8_0: fp16 scale, 32 int8; 18 for Q4_0: fp16 scale, 16 bytes whose low nibbles are values
 * 0..15 and high nibbles values 16..31; 20 for Q4_1: fp16 scale, fp16 minimum, 16 bytes of
 * nibbles as Q4_0's; 144 for a Q4_K super-block of 256 values: fp16 d and dmin, 12 bytes of
 * 6-bit scales and minima, then 4 x 32 bytes whose low nibbles are one block's values and
 * high nibbles the next block's); `w_scales` [n][k / 32] are the blocks' scales as fp32
 * (Q4_K's d * sc), `w_mins` the same for the minima (Q4_1's m, Q4_K's -dmin * m; NULL for
 * the others), converted once at load.
 *
 * The variants, picked by the compiler's macros (build.py builds one library per ISA level):
 *   - AVX512-VNNI (with VL) / AVX-VNNI: vpdpbusd on 256 bits (one block): Q4_1's and Q4_K's
 *     nibbles are unsigned as they are; Q8_0 / Q4_0 go as |wq| unsigned times x carrying wq's sign;
 *   - AVX2: the same with vpmaddubsw into int16 pairs (at most 2 * 128 * 127, no
 *     saturation) and vpmaddwd to int32 (llama.cpp's sign trick);
 *   - otherwise: the same sums in plain C.
 * All produce the same int32 block sums; only the order of the fp32 accumulation differs
 * (8 lanes summed at the end on x86).
 *
 * A tile is up to ROWS input rows against one weight row: a block's weights are unpacked
 * once for all of them. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#define BLOCK 32
#define ROWS 4 /* input rows per tile */
#define Q8_0 8 /* gguf.GGMLQuantizationType values */
#define Q4_0 2
#define Q4_1 3
#define Q4_K 12

/* Per-row, per-block symmetric int8 as linear_gguf.quantize_blocks (the same fp32
 * operations: compiled without -ffast-math, see int8_gemm.c's quantize_rows), and each
 * block's sum of the quantized values. */
__attribute__((optimize("no-fast-math"))) static void quantize_blocks(
    const float *x, int64_t ldx, int8_t *xq, float *xs, int32_t *xsums, int64_t rows, int k,
    int num_threads) {
    const int nb = k / BLOCK;
#pragma omp parallel for num_threads(num_threads) if (rows * k > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        for (int b = 0; b < nb; b++) {
            float amax = 0.f;
#pragma omp simd reduction(max : amax)
            for (int i = 0; i < BLOCK; i++) amax = fmaxf(amax, fabsf(xr[b * BLOCK + i]));
            const float inv = amax > 0.f ? 127.f / amax : 0.f;
            xs[r * nb + b] = amax > 0.f ? amax / 127.f : 1.f;
            int32_t sum = 0;
            for (int i = 0; i < BLOCK; i++) {
                const int8_t q = (int8_t)nearbyintf(xr[b * BLOCK + i] * inv);
                xq[r * k + b * BLOCK + i] = q;
                sum += q;
            }
            xsums[r * nb + b] = sum;
        }
    }
}

static inline int has_min(int qtype) { return qtype == Q4_1 || qtype == Q4_K; }

/* Bytes of the unit the file stores (a block, or Q4_K's super-block of 8), 0 if unread. */
static inline int unit_bytes(int qtype) {
    return qtype == Q8_0 ? 34 : qtype == Q4_0 ? 18 : qtype == Q4_1 ? 20 : qtype == Q4_K ? 144 : 0;
}

/* Block b of a weight row: where its values start (for Q4_K, the 32 bytes whose low
 * nibbles hold block b for b even, whose high nibbles for b odd). */
static inline const uint8_t *block_values(const uint8_t *wrow, int b, int qtype) {
    if (qtype == Q4_K) return wrow + (int64_t)(b >> 3) * 144 + 16 + ((b & 7) >> 1) * 32;
    return wrow + (int64_t)b * unit_bytes(qtype) + (qtype == Q4_1 ? 4 : 2);
}

#if defined(__AVX2__)
#include <immintrin.h>

/* A block's 32 nibbles as bytes 0..15, in value order. */
static inline __m256i nibbles(const uint8_t *packed_bytes) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)packed_bytes);
    const __m128i low = _mm_and_si128(packed, _mm_set1_epi8(0x0F));
    const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F));
    return _mm256_set_m128i(high, low);
}

/* Q4_K's block b: 32 nibbles, the low or high halves of 32 bytes, as bytes 0..15. */
static inline __m256i q4_k_nibbles(const uint8_t *values, int b) {
    const __m256i packed = _mm256_loadu_si256((const __m256i *)values);
    return _mm256_and_si256(b & 1 ? _mm256_srli_epi16(packed, 4) : packed,
                            _mm256_set1_epi8(0x0F));
}

/* 8 int32 partial sums of u . x, u unsigned, x signed (each pair within int16 for AVX2:
 * callers keep u <= 128, x in [-127, 127]). */
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
                                                       const uint8_t *wrow, const float *ws,
                                                       const float *wm, int nb, int qtype,
                                                       int nr, float out[ROWS]) {
    __m256 acc[ROWS];
    float mins[ROWS];
    for (int i = 0; i < nr; i++) acc[i] = _mm256_setzero_ps(), mins[i] = 0.f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *values = block_values(wrow, b, qtype);
        __m256i u, sign = _mm256_setzero_si256(); /* the weights unsigned, and their sign */
        if (qtype == Q4_1) {
            u = nibbles(values);
        } else if (qtype == Q4_K) {
            u = q4_k_nibbles(values, b);
        } else {
            const __m256i w = qtype == Q8_0
                                  ? _mm256_loadu_si256((const __m256i *)values)
                                  : _mm256_sub_epi8(nibbles(values), _mm256_set1_epi8(8));
            u = _mm256_sign_epi8(w, w); /* |w|, unsigned (|-128| = 128 as u8) */
            sign = w;
        }
        for (int i = 0; i < nr; i++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(xq + (int64_t)i * k + b * BLOCK));
            if (!has_min(qtype)) x = _mm256_sign_epi8(x, sign); /* 0 where w is */
            const float sx = xs[i * nb + b];
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_unsigned(u, x)),
                                     _mm256_set1_ps(sx * ws[b]), acc[i]);
            if (has_min(qtype)) mins[i] = fmaf(sx * wm[b], (float)xsums[i * nb + b], mins[i]);
        }
    }
    for (int i = 0; i < nr; i++) out[i] = hsum(acc[i]) + mins[i];
}

#else /* another architecture, or x86 below AVX2 */

static inline void tile(const int8_t *xq, int k, const float *xs, const int32_t *xsums,
                        const uint8_t *wrow, const float *ws, const float *wm, int nb, int qtype,
                        int nr, float out[ROWS]) {
    for (int i = 0; i < nr; i++) {
        float acc = 0.f;
        for (int b = 0; b < nb; b++) {
            const uint8_t *q = block_values(wrow, b, qtype);
            int32_t dot = 0;
            for (int j = 0; j < BLOCK; j++) {
                const int nibble = qtype == Q4_K ? (b & 1 ? q[j] >> 4 : q[j] & 0x0F)
                                   : j < 16      ? (q[j] & 0x0F)
                                                 : (q[j - 16] >> 4);
                const int w = qtype == Q8_0 ? (int8_t)q[j] : qtype == Q4_0 ? nibble - 8 : nibble;
                dot += w * xq[(int64_t)i * k + b * BLOCK + j];
            }
            const float sx = xs[i * nb + b];
            acc = fmaf((float)dot, sx * ws[b], acc);
            if (has_min(qtype)) acc = fmaf(sx * wm[b], (float)xsums[i * nb + b], acc);
        }
        out[i] = acc;
    }
}
#endif

/* x [rows, k] fp32 (row stride ldx), k a multiple of 32; blocks, w_scales and w_mins as
 * above for n output columns; bias [n] or NULL; residual [rows, n] (row stride ldr) or
 * NULL; y [rows, n] contiguous. xq: rows * k bytes, xs: rows * k / 32 floats and xsums:
 * rows * k / 32 ints, for the quantized rows. Returns 0, or -1 for a block type it does not
 * read (Q4_K with k not a multiple of 256, Q4_1 / Q4_K without their minima). */
int gguf_linear_f32(const float *x, int64_t ldx, const uint8_t *blocks, const float *w_scales,
                    const float *w_mins, int qtype, const float *bias, const float *residual,
                    int64_t ldr, float *y, int8_t *xq, float *xs, int32_t *xsums, int64_t rows,
                    int k, int n, int num_threads) {
    const int unit_values = qtype == Q4_K ? 256 : BLOCK;
    if (!unit_bytes(qtype) || k % unit_values || (has_min(qtype) && !w_mins)) return -1;
    const int nb = k / BLOCK;
    const int64_t row_bytes = (int64_t)(k / unit_values) * unit_bytes(qtype);
    quantize_blocks(x, ldx, xq, xs, xsums, rows, k, num_threads);
    /* Columns split between the threads; a weight row (k / 32 blocks, under 2 KiB for
     * k <= 2048 in Q8_0) stays in L1 while every input row passes over it. */
#pragma omp parallel for num_threads(num_threads) schedule(static) \
    if (rows * (int64_t)n * k > 1 << 18)
    for (int c = 0; c < n; c++) {
        const uint8_t *wrow = blocks + c * row_bytes;
        const float *ws = w_scales + (int64_t)c * nb;
        const float *wm = w_mins ? w_mins + (int64_t)c * nb : NULL;
        for (int64_t r = 0; r < rows; r += ROWS) {
            const int nr = rows - r < ROWS ? (int)(rows - r) : ROWS;
            const int8_t *xr = xq + r * k;
            const float *sx = xs + r * nb;
            const int32_t *sums = xsums + r * nb;
            float out[ROWS];
            switch (qtype * 8 + nr) { /* one inlined copy per block type and row count */
#define TILE(TYPE, NR)                                                  \
    case TYPE * 8 + NR:                                                 \
        tile(xr, k, sx, sums, wrow, ws, wm, nb, TYPE, NR, out); \
        break;
#define TILES(TYPE) TILE(TYPE, 1) TILE(TYPE, 2) TILE(TYPE, 3) TILE(TYPE, 4)
                TILES(Q8_0) TILES(Q4_0) TILES(Q4_1) TILES(Q4_K)
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
