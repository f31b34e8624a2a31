/* Linear layer over GGUF Q8_0 / Q4_0 weight blocks as the file stores them (linear_gguf.py):
 *   y[r][c] = sum_b sx[r][b] * sw[c][b] * (xq[r, b] . wq[c, b]) (+ bias) (+ residual)
 * where b runs over the blocks of 32 input values, wq are the block's integers (Q8_0: int8;
 * Q4_0: nibble - 8) and x is quantized here per row and block of 32 to int8 in [-127, 127]
 * (llama.cpp's q8_0 activations). Each block's dot product is exact in int32, converted to
 * fp32 and accumulated with sx * sw.
 *
 * Weights: `blocks` is the file's bytes, n rows of k / 32 blocks of `block_bytes` (34 for
 * Q8_0: fp16 scale, 32 int8; 18 for Q4_0: fp16 scale, 16 bytes whose low nibbles are values
 * 0..15 and high nibbles values 16..31); `w_scales` [n][k / 32] are the fp16 scales as fp32,
 * converted once at load.
 *
 * The variants, picked by the compiler's macros (build.py builds one library per ISA level):
 *   - AVX512-VNNI (with VL) / AVX-VNNI: vpdpbusd on 256 bits (one block), |wq| unsigned
 *     times x carrying wq's sign;
 *   - AVX2: llama.cpp's sign trick, vpmaddubsw(|wq|, sign(x, wq)) into int16 pairs (at most
 *     2 * 128 * 127, no saturation) and vpmaddwd to int32;
 *   - otherwise: the same sums in plain C.
 * All produce the same int32 block sums; only the order of the fp32 accumulation differs
 * (8 lanes summed at the end on x86). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#define BLOCK 32
#define Q8_0 8 /* gguf.GGMLQuantizationType values */
#define Q4_0 2

/* Per-row, per-block symmetric int8 as linear_gguf.quantize_blocks (the same fp32
 * operations: compiled without -ffast-math, see int8_gemm.c's quantize_rows). */
__attribute__((optimize("no-fast-math"))) static void quantize_blocks(const float *x,
                                                                     int64_t ldx, int8_t *xq,
                                                                     float *xs, int64_t rows,
                                                                     int k, int num_threads) {
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
            for (int i = 0; i < BLOCK; i++)
                xq[r * k + b * BLOCK + i] = (int8_t)nearbyintf(xr[b * BLOCK + i] * inv);
        }
    }
}

#if defined(__AVX2__)
#include <immintrin.h>

/* The block's 32 weight integers as int8 lanes. */
static inline __m256i weights_q8(const uint8_t *block) {
    return _mm256_loadu_si256((const __m256i *)(block + 2));
}

static inline __m256i weights_q4(const uint8_t *block) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)(block + 2));
    const __m128i low = _mm_and_si128(packed, _mm_set1_epi8(0x0F));
    const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F));
    return _mm256_sub_epi8(_mm256_set_m128i(high, low), _mm256_set1_epi8(8));
}

/* 8 int32 partial sums of w . x (signed int8 both). */
static inline __m256i dot32(__m256i w, __m256i x) {
    const __m256i aw = _mm256_sign_epi8(w, w); /* |w|, unsigned (|-128| = 128 as u8) */
    const __m256i sx = _mm256_sign_epi8(x, w); /* x with w's sign, 0 where w is */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), aw, sx);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
#endif
}

static inline float hsum(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

static inline float row_dot(const int8_t *xq, const float *xs, const uint8_t *wrow,
                            const float *ws, int nb, int block_bytes, int qtype) {
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *block = wrow + (int64_t)b * block_bytes;
        const __m256i w = qtype == Q8_0 ? weights_q8(block) : weights_q4(block);
        const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + b * BLOCK));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(w, x)), _mm256_set1_ps(xs[b] * ws[b]),
                              acc);
    }
    return hsum(acc);
}

#else /* another architecture, or x86 below AVX2 */

static inline float row_dot(const int8_t *xq, const float *xs, const uint8_t *wrow,
                            const float *ws, int nb, int block_bytes, int qtype) {
    float acc = 0.f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *q = wrow + (int64_t)b * block_bytes + 2;
        int32_t dot = 0;
        for (int i = 0; i < BLOCK; i++) {
            const int w = qtype == Q8_0 ? (int8_t)q[i]
                                        : (i < 16 ? (q[i] & 0x0F) : (q[i - 16] >> 4)) - 8;
            dot += w * xq[b * BLOCK + i];
        }
        acc = fmaf((float)dot, xs[b] * ws[b], acc);
    }
    return acc;
}
#endif

/* x [rows, k] fp32 (row stride ldx), k a multiple of 32; blocks and w_scales as above for n
 * output columns; bias [n] or NULL; residual [rows, n] (row stride ldr) or NULL; y [rows, n]
 * contiguous. xq: rows * k bytes and xs: rows * k / 32 floats, for the quantized rows.
 * Returns 0, or -1 for a block type it does not read. */
int gguf_linear_f32(const float *x, int64_t ldx, const uint8_t *blocks, const float *w_scales,
                    int qtype, const float *bias, const float *residual, int64_t ldr, float *y,
                    int8_t *xq, float *xs, int64_t rows, int k, int n, int num_threads) {
    const int block_bytes = qtype == Q8_0 ? 34 : qtype == Q4_0 ? 18 : 0;
    if (!block_bytes || k % BLOCK) return -1;
    const int nb = k / BLOCK;
    const int64_t row_bytes = (int64_t)nb * block_bytes;
    quantize_blocks(x, ldx, xq, xs, rows, k, num_threads);
    /* Columns split between the threads; a weight row (k / 32 blocks, under 2 KiB for
     * k <= 2048 in Q8_0) stays in L1 while every input row passes over it. */
#pragma omp parallel for num_threads(num_threads) schedule(static) \
    if (rows * (int64_t)n * k > 1 << 18)
    for (int c = 0; c < n; c++) {
        const uint8_t *wrow = blocks + c * row_bytes;
        const float *ws = w_scales + (int64_t)c * nb;
        for (int64_t r = 0; r < rows; r++) {
            float v = row_dot(xq + r * k, xs + r * nb, wrow, ws, nb, block_bytes, qtype);
            if (bias) v += bias[c];
            if (residual) v += residual[r * ldr + c];
            y[r * (int64_t)n + c] = v;
        }
    }
    return 0;
}
