/* W8A8 linear layer for AVX2 CPUs without VNNI: y = (xq . wq) * sx[row] * sw[col]
 * (+ bias) (+ residual), with x quantized here, per row, symmetric, to int8 in [-127, 127],
 * and w quantized once at load, per output channel (linear_int8.py packs it).
 *
 * AVX2's only int8 multiply, vpmaddubsw, takes one unsigned and one signed operand and
 * adds adjacent products into int16 with saturation. oneDNN and fbgemm feed it u8
 * activations with a zero point, where 255 * 127 * 2 overflows int16 (their outputs here
 * were 4-13% off); on CPUs without VNNI torch's quantization therefore drops a bit of the
 * activations (reduce_range). This kernel uses the sign trick instead: |x| (unsigned) times
 * w * sign(x) (vpsignb) is x * w, and 127 * 127 * 2 fits in int16, so the products are
 * exact at 8 bits. vpmaddwd against ones widens the pairs to int32.
 *
 * Packed weights: NR output columns at a time ("panels"), K in chunks of 32 bytes,
 *   w[((panel * chunks + c) * NR + j) * 32 + b] = wq[panel * NR + j][c * 32 + b],
 * zero-padded to whole panels and chunks, so one chunk of a panel is NR contiguous vectors. */
#include <math.h>
#include <stdint.h>

#define NR 8 /* output columns per panel: 8 accumulators, 8 weight vectors, x, |x|, ones */
#define MAX_BLOCK_PANELS 16 /* 128 columns x K: a block of weights that stays in L2 */

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

/* The int32 dot products of one row of xq with the NR columns of one panel. One row at a
 * time: with 2 rows x 4 columns (or 4 x 2) GCC spilled accumulators, and this was the
 * fastest of the four shapes tried (64 x 3072 x 576: 3.7 ms against 3.9-4.6 on one thread). */
static void tile(const int8_t *xq, int kp, const int8_t *w, int32_t out[NR]) {
    __m256i acc[NR];
    for (int j = 0; j < NR; j++) acc[j] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int c = 0; c < kp / 32; c++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + c * 32));
        const __m256i ax = _mm256_sign_epi8(xv, xv);
        for (int j = 0; j < NR; j++) {
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(w + (c * NR + j) * 32));
            const __m256i pairs = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv, xv));
            acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(pairs, ones));
        }
    }
    for (int j = 0; j < NR; j += 4) { /* the 8 lanes of each accumulator, 4 sums at once */
        const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[j], acc[j + 1]),
                                            _mm256_hadd_epi32(acc[j + 2], acc[j + 3]));
        _mm_storeu_si128((__m128i *)(out + j), _mm_add_epi32(_mm256_castsi256_si128(s),
                                                             _mm256_extracti128_si256(s, 1)));
    }
}
#else /* no AVX2 (another architecture): the same sums, one product at a time */
static void tile(const int8_t *xq, int kp, const int8_t *w, int32_t out[NR]) {
    for (int j = 0; j < NR; j++) {
        int32_t sum = 0;
        for (int c = 0; c < kp / 32; c++)
            for (int b = 0; b < 32; b++) sum += xq[c * 32 + b] * w[(c * NR + j) * 32 + b];
        out[j] = sum;
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
    /* Blocks of at most MAX_BLOCK_PANELS, as many as a multiple of the threads: 72 panels
     * (576 columns) on 2 threads are 6 blocks of 12, not 16 + 16 + 16 + 16 + 8. */
    const int threads = num_threads > 0 ? num_threads : 1;
    const int rounds = (panels + threads * MAX_BLOCK_PANELS - 1) / (threads * MAX_BLOCK_PANELS);
    const int per_block = (panels + threads * rounds - 1) / (threads * rounds);
    const int blocks = (panels + per_block - 1) / per_block;
    const int64_t panel_bytes = (int64_t)kp * NR;
#pragma omp parallel for num_threads(num_threads) schedule(static) \
    if (rows * (int64_t)n * kp > 1 << 18)
    for (int b = 0; b < blocks; b++) {
        const int last = panels < (b + 1) * per_block ? panels : (b + 1) * per_block;
        for (int64_t r = 0; r < rows; r++) {
            const float sx = x_scales[r];
            for (int p = b * per_block; p < last; p++) {
                int32_t dots[NR];
                tile(scratch + r * kp, kp, w + p * panel_bytes, dots);
                for (int j = 0; j < NR && p * NR + j < n; j++) {
                    const int col = p * NR + j;
                    float v = (float)dots[j] * (sx * w_scales[col]);
                    if (bias) v += bias[col];
                    if (residual) v += residual[r * ldr + col];
                    y[r * (int64_t)n + col] = v;
                }
            }
        }
    }
}
