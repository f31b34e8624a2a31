/* W8A8 linear layer for AVX2 CPUs without VNNI: y = (xq . wq) * sx[row] * sw[col]
 * (+ bias) (+ residual), with x quantized here, per row, symmetric, to int8 in [-127, 127],
 * and w quantized once at load, per output channel (linear_int8.py packs it).
 *
 * AVX2's only int8 multiply, vpmaddubsw, takes one unsigned and one signed operand and
 * adds adjacent products into int16 with saturation. oneDNN and fbgemm feed it u8
 * activations with a zero point, where 255 * 127 * 2 overflows int16 (their outputs here
 * were 10% off); on CPUs without VNNI torch's quantization therefore drops a bit of the
 * activations (reduce_range). This kernel uses the sign trick instead: |x| (unsigned) times
 * w * sign(x) (vpsignb) is x * w, and 127 * 127 * 2 fits in int16, so the products are
 * exact at 8 bits. vpmaddwd against ones widens the pairs to int32.
 *
 * Packed weights: NR output columns at a time ("panels"), K in chunks of 32 bytes,
 *   w[((panel * chunks + c) * NR + j) * 32 + b] = wq[panel * NR + j][c * 32 + b],
 * zero-padded to whole panels and chunks, so one chunk of a panel is NR contiguous vectors. */
#include <math.h>
#include <stdint.h>

#define NR 4 /* output columns per panel */
#define MR 2 /* rows per register tile: 8 accumulators + 4 weight vectors + temporaries */
#define PANELS_PER_BLOCK 16 /* 64 columns x K: a block of weights that stays in L2 */

/* Per-row symmetric int8: q = round(x * 127 / max|x|), scale = max|x| / 127 (1 for a zero
 * row), padded with zeros to kp bytes. Same fp32 operations as linear_int8.py's reference. */
static void quantize_rows(const float *x, int64_t ldx, int8_t *xq, float *scales,
                          int64_t rows, int k, int kp, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * k > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        int8_t *q = xq + r * kp;
        float amax = 0.f;
#pragma omp simd reduction(max : amax)
        for (int i = 0; i < k; i++) amax = fmaxf(amax, fabsf(xr[i]));
        const float inv = amax > 0.f ? 127.f / amax : 0.f;
        scales[r] = amax > 0.f ? amax / 127.f : 1.f;
        for (int i = 0; i < k; i++) q[i] = (int8_t)nearbyintf(xr[i] * inv);
        for (int i = k; i < kp; i++) q[i] = 0;
    }
}

#ifdef __AVX2__
#include <immintrin.h>

/* The int32 dot products of `mr` rows of xq with the NR columns of one panel. */
static inline __attribute__((always_inline)) void tile(int mr, const int8_t *xq, int kp,
                                                       const int8_t *w, int32_t out[MR][NR]) {
    __m256i acc[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int c = 0; c < kp / 32; c++) {
        __m256i wv[NR];
        for (int j = 0; j < NR; j++)
            wv[j] = _mm256_loadu_si256((const __m256i *)(w + (c * NR + j) * 32));
        for (int i = 0; i < mr; i++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + i * kp + c * 32));
            const __m256i ax = _mm256_sign_epi8(xv, xv);
            for (int j = 0; j < NR; j++) {
                const __m256i pairs = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv[j], xv));
                acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(pairs, ones));
            }
        }
    }
    for (int i = 0; i < mr; i++) { /* the 8 lanes of each accumulator, NR sums at once */
        const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[i][0], acc[i][1]),
                                            _mm256_hadd_epi32(acc[i][2], acc[i][3]));
        _mm_storeu_si128((__m128i *)out[i], _mm_add_epi32(_mm256_castsi256_si128(s),
                                                          _mm256_extracti128_si256(s, 1)));
    }
}
#else /* no AVX2 (another architecture): the same sums, one product at a time */
static inline void tile(int mr, const int8_t *xq, int kp, const int8_t *w,
                        int32_t out[MR][NR]) {
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NR; j++) {
            int32_t sum = 0;
            for (int c = 0; c < kp / 32; c++)
                for (int b = 0; b < 32; b++)
                    sum += xq[i * kp + c * 32 + b] * w[(c * NR + j) * 32 + b];
            out[i][j] = sum;
        }
}
#endif

/* x [rows, k] fp32 (row stride ldx); w packed as above for n columns; w_scales [n];
 * bias [n] or NULL; residual [rows, n] (row stride ldr) or NULL; y [rows, n] contiguous.
 * scratch: rows * kp bytes for the quantized rows; x_scales: rows floats. */
void int8_linear_f32(const float *x, int64_t ldx, const int8_t *w, const float *w_scales,
                     const float *bias, const float *residual, int64_t ldr, float *y,
                     int8_t *scratch, float *x_scales, int64_t rows, int k, int kp, int n,
                     int num_threads) {
    quantize_rows(x, ldx, scratch, x_scales, rows, k, kp, num_threads);
    const int panels = (n + NR - 1) / NR;
    const int blocks = (panels + PANELS_PER_BLOCK - 1) / PANELS_PER_BLOCK;
    const int64_t panel_bytes = (int64_t)kp * NR;
#pragma omp parallel for num_threads(num_threads) schedule(static) \
    if (rows * (int64_t)n * kp > 1 << 18)
    for (int b = 0; b < blocks; b++) {
        const int last = panels < (b + 1) * PANELS_PER_BLOCK ? panels : (b + 1) * PANELS_PER_BLOCK;
        for (int64_t r = 0; r < rows; r += MR) {
            const int mr = rows - r < MR ? (int)(rows - r) : MR;
            for (int p = b * PANELS_PER_BLOCK; p < last; p++) {
                int32_t dots[MR][NR];
                if (mr == MR)
                    tile(MR, scratch + r * kp, kp, w + p * panel_bytes, dots);
                else
                    tile(1, scratch + r * kp, kp, w + p * panel_bytes, dots);
                for (int i = 0; i < mr; i++) {
                    const float sx = x_scales[r + i];
                    for (int j = 0; j < NR && p * NR + j < n; j++) {
                        const int col = p * NR + j;
                        float v = (float)dots[i][j] * (sx * w_scales[col]);
                        if (bias) v += bias[col];
                        if (residual) v += residual[(r + i) * ldr + col];
                        y[(r + i) * (int64_t)n + col] = v;
                    }
                }
            }
        }
    }
}
