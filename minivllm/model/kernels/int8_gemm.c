/* W8A8 linear layer for AVX2 CPUs without VNNI: y = (xq . wq) * sx[row] * sw[col]
 * (+ bias) (+ residual), with x quantized here, per row, symmetric, to int8 in [-127, 127],
 * and w quantized once at load, per output channel, to [-63, 63] (linear_int8.py packs it).
 *
 * AVX2's only int8 multiply, vpmaddubsw, takes one unsigned and one signed operand and
 * adds adjacent products into int16 with saturation. oneDNN and fbgemm feed it u8
 * activations with a zero point, where 255 * 127 * 2 overflows int16 (their outputs here
 * were 4-13% off). Here the weights are the unsigned side: stored as wq + 64, in [1, 127],
 * so 127 * 127 * 2 fits in int16 and every product is exact, and the offset comes back out
 * per row: sum(x * (w + 64)) - 64 * sum(x). That costs the weights their eighth bit, which
 * measured cheaper in accuracy than taking it from the activations (docs/quantization.md),
 * and saves the sign step an all-8-bit product needs (vpsignb on both operands): the
 * kernel is 1.2-1.3x faster for it (benchmarks/int8_gemm.py). vpmaddwd against ones widens
 * the int16 pairs to int32.
 *
 * A tile is 3 rows x 4 columns: 12 accumulators, the weight vector, the product and the
 * ones fill AVX2's 16 registers, and each x row is the multiply's memory operand. GCC spilled
 * accumulators of every tile shape tried (1x8 .. 8x2) to the stack inside the loop, so the
 * loop is written in assembly (tile3x4): 1.11-1.15x the compiled 2 x 8 tile, the same sums.
 *
 * Packed weights: NR output columns at a time ("panels"), K in chunks of 32 bytes,
 *   w[((panel * chunks + c) * NR + j) * 32 + b] = wq[panel * NR + j][c * 32 + b] + 64,
 * zero-padded (x is zero there) to whole panels and chunks, so one chunk of a panel is NR
 * contiguous vectors. */
#include <math.h>
#include <stdint.h>

#include "kernels.h"

#define NR 4         /* output columns per panel */
#define MR 3         /* rows per tile */
#define ROW_BLOCK 96 /* rows whose quantized x (96 x K bytes) stays in L2 across panels */
#define W_OFFSET 64

/* Per-row symmetric int8: q = round(x * 127 / max|x|), scale = max|x| / 127 (1 for a zero
 * row), padded with zeros to kp bytes, and the row's sum of q for the offset. Same fp32
 * operations as linear_int8.py's reference. */
static void quantize_rows(const float *x, int64_t ldx, int8_t *xq, float *scales,
                          int32_t *sums, int64_t rows, int k, int kp, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * k > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        int8_t *q = xq + r * kp;
        float amax = 0.f;
#pragma omp simd reduction(max : amax)
        for (int i = 0; i < k; i++) amax = fmaxf(amax, fabsf(xr[i]));
        const float inv = amax > 0.f ? 127.f / amax : 0.f;
        scales[r] = amax > 0.f ? amax / 127.f : 1.f;
        int32_t sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < k; i++) {
            q[i] = (int8_t)nearbyintf(xr[i] * inv);
            sum += q[i];
        }
        for (int i = k; i < kp; i++) q[i] = 0;
        sums[r] = sum;
    }
}

#ifdef __AVX2__
#include <immintrin.h>

/* The int32 dot products of `rows` (1..MR) consecutive rows of xq with the NR columns of
 * one panel: out[r][j]. Inlined per row count; the full tiles take tile3x4 below. */
static inline __attribute__((always_inline)) void tile(const int8_t *xq, int kp,
                                                       const uint8_t *w, int rows,
                                                       int32_t out[MR][NR]) {
    __m256i acc[MR][NR];
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < NR; j++) acc[r][j] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int c = 0; c < kp / 32; c++) {
        __m256i xv[MR];
        for (int r = 0; r < rows; r++)
            xv[r] = _mm256_loadu_si256((const __m256i *)(xq + r * (int64_t)kp + c * 32));
        for (int j = 0; j < NR; j++) {
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(w + (c * NR + j) * 32));
            for (int r = 0; r < rows; r++)
                acc[r][j] = _mm256_add_epi32(
                    acc[r][j], _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv[r]), ones));
        }
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < NR; j += 4) { /* the 8 lanes of each accumulator, 4 sums at once */
            const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[r][j], acc[r][j + 1]),
                                                _mm256_hadd_epi32(acc[r][j + 2], acc[r][j + 3]));
            _mm_storeu_si128((__m128i *)(out[r] + j),
                             _mm_add_epi32(_mm256_castsi256_si128(s),
                                           _mm256_extracti128_si256(s, 1)));
        }
}

#if defined(__x86_64__)
#define FULL_TILE_ASM 1
/* tile() for MR = 3 rows, NR = 4 columns, with the accumulators pinned in registers. ymm13
 * holds the ones, ymm14 a chunk of one column's weights, ymm15 the product; the rows are
 * kp bytes apart. (30 operands is asm's limit: the 12 accumulators count twice.) */
static void tile3x4(const int8_t *xq, int64_t kp, const uint8_t *w, int32_t out[MR][NR]) {
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a02 = a00, a03 = a00;
    __m256i a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m256i a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    const int8_t *x = xq, *end = xq + kp;
    __asm__ volatile(
        "vpcmpeqw %%ymm13, %%ymm13, %%ymm13\n\t"
        "vpsrlw $15, %%ymm13, %%ymm13\n\t" /* 1 in every int16 */
        "1:\n\t"
#define COLUMN(OFFSET, ROW0, ROW1, ROW2)                                  \
        "vmovdqu " #OFFSET "(%[w]), %%ymm14\n\t"                         \
        "vpmaddubsw (%[x]), %%ymm14, %%ymm15\n\t"                        \
        "vpmaddwd %%ymm13, %%ymm15, %%ymm15\n\t"                         \
        "vpaddd %%ymm15, %[" #ROW0 "], %[" #ROW0 "]\n\t"                 \
        "vpmaddubsw (%[x],%[kp]), %%ymm14, %%ymm15\n\t"                  \
        "vpmaddwd %%ymm13, %%ymm15, %%ymm15\n\t"                         \
        "vpaddd %%ymm15, %[" #ROW1 "], %[" #ROW1 "]\n\t"                 \
        "vpmaddubsw (%[x],%[kp],2), %%ymm14, %%ymm15\n\t"                \
        "vpmaddwd %%ymm13, %%ymm15, %%ymm15\n\t"                         \
        "vpaddd %%ymm15, %[" #ROW2 "], %[" #ROW2 "]\n\t"
        COLUMN(0, a00, a10, a20)
        COLUMN(32, a01, a11, a21)
        COLUMN(64, a02, a12, a22)
        COLUMN(96, a03, a13, a23)
#undef COLUMN
        "addq $32, %[x]\n\t"
        "subq $-128, %[w]\n\t"
        "cmpq %[end], %[x]\n\t"
        "jb 1b\n\t"
        : [a00] "+x"(a00), [a01] "+x"(a01), [a02] "+x"(a02), [a03] "+x"(a03),
          [a10] "+x"(a10), [a11] "+x"(a11), [a12] "+x"(a12), [a13] "+x"(a13),
          [a20] "+x"(a20), [a21] "+x"(a21), [a22] "+x"(a22), [a23] "+x"(a23),
          [x] "+r"(x), [w] "+r"(w)
        : [kp] "r"(kp), [end] "r"(end)
        : "xmm13", "xmm14", "xmm15", "memory", "cc");
    const __m256i acc[MR][NR] = {{a00, a01, a02, a03}, {a10, a11, a12, a13},
                                 {a20, a21, a22, a23}};
    for (int r = 0; r < MR; r++) {
        const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[r][0], acc[r][1]),
                                            _mm256_hadd_epi32(acc[r][2], acc[r][3]));
        _mm_storeu_si128((__m128i *)out[r], _mm_add_epi32(_mm256_castsi256_si128(s),
                                                          _mm256_extracti128_si256(s, 1)));
    }
}
#endif
#else /* no AVX2 (another architecture): the same sums, one product at a time */
static void tile(const int8_t *xq, int kp, const uint8_t *w, int rows, int32_t out[MR][NR]) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < NR; j++) {
            int32_t sum = 0;
            for (int c = 0; c < kp / 32; c++)
                for (int b = 0; b < 32; b++)
                    sum += xq[r * (int64_t)kp + c * 32 + b] * w[(c * NR + j) * 32 + b];
            out[r][j] = sum;
        }
}
#endif

/* x [rows, k] fp32 (row stride ldx); w packed as above for n columns; w_scales [n];
 * bias [n] or NULL; residual [rows, n] (row stride ldr) or NULL; y [rows, n] contiguous.
 * scratch: rows * kp bytes for the quantized rows; x_scales, x_sums: rows each. */
void int8_linear_f32(const float *x, int64_t ldx, const uint8_t *w, const float *w_scales,
                     const float *bias, const float *residual, int64_t ldr, float *y,
                     int8_t *scratch, float *x_scales, int32_t *x_sums, int64_t rows, int k,
                     int kp, int n, int num_threads) {
    quantize_rows(x, ldx, scratch, x_scales, x_sums, rows, k, kp, num_threads);
    const int panels = (n + NR - 1) / NR;
    const int64_t panel_bytes = (int64_t)kp * NR;
    /* Each thread takes a contiguous share of the panels for a block of rows; a panel
     * (NR x K bytes) stays in L1 while the block's rows pass over it. */
#pragma omp parallel num_threads(num_threads) if (rows * (int64_t)n * kp > 1 << 18)
    for (int64_t first = 0; first < rows; first += ROW_BLOCK) {
        const int64_t end = rows < first + ROW_BLOCK ? rows : first + ROW_BLOCK;
#pragma omp for schedule(static) nowait
        for (int p = 0; p < panels; p++) {
            for (int64_t r = first; r < end; r += MR) {
                int32_t dots[MR][NR];
                const int tile_rows = end - r < MR ? (int)(end - r) : MR;
                const int8_t *xr = scratch + r * kp;
                const uint8_t *wp = w + p * panel_bytes;
                if (tile_rows == MR)
#ifdef FULL_TILE_ASM
                    tile3x4(xr, kp, wp, dots);
#else
                    tile(xr, kp, wp, MR, dots);
#endif
                else if (tile_rows == 2)
                    tile(xr, kp, wp, 2, dots);
                else
                    tile(xr, kp, wp, 1, dots);
                for (int i = 0; i < tile_rows; i++) {
                    const float sx = x_scales[r + i];
                    const int32_t offset = W_OFFSET * x_sums[r + i];
                    for (int j = 0; j < NR && p * NR + j < n; j++) {
                        const int col = p * NR + j;
                        float v = (float)(dots[i][j] - offset) * (sx * w_scales[col]);
                        if (bias) v += bias[col];
                        if (residual) v += residual[(r + i) * ldr + col];
                        y[(r + i) * (int64_t)n + col] = v;
                    }
                }
            }
        }
    }
}
