/* The linear layer over weights packed once at load into panels of output columns, fp32
 * arithmetic (linear_panels.py): fp32 x times weights stored as fp32 or bf16. One tile loop
 * and one driver for both; a weight type only says how a panel's k-th PANEL values become
 * two fp32 vectors (panel_operands).
 *
 * - bf16-stored weights (CPUs without bf16 dot products: AVX2, AVX-512F without
 *   AVX512-BF16): a decode step streams every weight from DRAM, so a bf16 checkpoint read
 *   as bf16 costs half fp32's bytes; every product is exact (a bf16 value is an fp32 value
 *   with 16 zero low bits), so the result is fp32's on the bf16 weights.
 * - fp32 weights: the few rows of a decode step, where oneDNN's and MKL's fp32 linears run
 *   far below the memory's bandwidth: SmolLM2's 30 layers of linears (weights streamed
 *   from memory, AVX-512 Xeon, 2 threads) at 8 rows took 21 ms here against oneDNN's 28
 *   and MKL's 37; at 32 rows 37 against 46 and 49. Each weight vector loaded feeds every
 *   row of a tile. The engine measures which is faster per shape and row count
 *   (linear_choice.py); from ~128 rows all three are within noise.
 *
 * Layout (linear_panels.pack_weight): panels of PANEL = 2 x VEC output columns, k-major.
 * fp32: for each k, the panel's PANEL values in column order (two vector loads). bf16: for
 * each k, PANEL bf16 values in VEC 32-bit words, word j holding column j in its low half and
 * column j + VEC in its high half: one vector load then gives both halves of the panel as
 * fp32 with one shift (column j: the low half moved up) and one and (column j + VEC: the low
 * half cleared), no shuffles.
 *
 * Every output is its k terms accumulated in k order by one FMA chain whatever the number of
 * rows or how they are tiled: a row's result does not depend on the batch it runs in. */
#include <stdint.h>

#include "kernels.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define VEC 16
#define MAX_ROWS 12 /* rows of x per tile: 24 accumulators */
typedef __m512 vf;
typedef __m512i vi;
#define load_words(p) _mm512_loadu_si512((const void *)(p))
#define low_cols(w) _mm512_castsi512_ps(_mm512_slli_epi32(w, 16))
#define high_cols(w) _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(-65536)))
#define loadu _mm512_loadu_ps
#define fmadd _mm512_fmadd_ps
#define set1 _mm512_set1_ps
#define zero _mm512_setzero_ps
#define storeu _mm512_storeu_ps
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VEC 8
#define MAX_ROWS 6 /* 12 accumulators of 16 registers */
typedef __m256 vf;
typedef __m256i vi;
#define load_words(p) _mm256_loadu_si256((const __m256i *)(p))
#define low_cols(w) _mm256_castsi256_ps(_mm256_slli_epi32(w, 16))
#define high_cols(w) _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(-65536)))
#define loadu _mm256_loadu_ps
#define fmadd _mm256_fmadd_ps
#define set1 _mm256_set1_ps
#define zero _mm256_setzero_ps
#define storeu _mm256_storeu_ps
#endif

#ifdef VEC
#define PANEL (2 * VEC)
#define CHUNK_BYTES (512 * 1024) /* of x per task at most: a long prompt's rows stay in L2 */
#define PREFETCH 2048 /* bytes ahead in the panel's stream */

/* The panel's values at k (from `p`, which points at them) as two fp32 vectors: columns
 * 0..VEC-1 and VEC..PANEL-1. Returns the bytes the k step spans. */
static inline __attribute__((always_inline)) int panel_operands(const void *p, int stored,
                                                                vf *lo, vf *hi) {
    if (stored == PANEL_STORED_F32) {
        *lo = loadu((const float *)p);
        *hi = loadu((const float *)p + VEC);
        return PANEL * 4;
    }
    const vi w = load_words(p);
    *lo = low_cols(w);
    *hi = high_cols(w);
    return PANEL * 2;
}

/* y's rows (nr of them), columns c0.. (cols of them) = x's rows times the panel p. */
static inline __attribute__((always_inline)) void tile(
    const float *x, int64_t ldx, const char *p, int stored, int k, int nr, const float *bias,
    const float *residual, int64_t ldr, float *y, int64_t n, int cols) {
    vf acc[MAX_ROWS][2];
    for (int i = 0; i < nr; i++) acc[i][0] = acc[i][1] = zero();
    for (int kk = 0; kk < k; kk++) {
        /* a cache line ahead per 64 bytes the step reads: one for bf16, two for fp32 */
        _mm_prefetch(p + PREFETCH, _MM_HINT_T0);
        if (stored == PANEL_STORED_F32) _mm_prefetch(p + PREFETCH + 64, _MM_HINT_T0);
        vf lo, hi;
        p += panel_operands(p, stored, &lo, &hi);
        for (int i = 0; i < nr; i++) {
            const vf xv = set1(x[i * ldx + kk]);
            acc[i][0] = fmadd(lo, xv, acc[i][0]);
            acc[i][1] = fmadd(hi, xv, acc[i][1]);
        }
    }
    for (int i = 0; i < nr; i++) {
        float out[PANEL];
        storeu(out, acc[i][0]);
        storeu(out + VEC, acc[i][1]);
        if (bias)
            for (int c = 0; c < cols; c++) out[c] += bias[c];
        /* -ffast-math would otherwise add bias and residual first in some row counts'
         * copies and not others: a barrier keeps (acc + bias) + residual in every one */
        __asm__ volatile("" ::: "memory");
        for (int c = 0; c < cols; c++) y[i * n + c] = residual ? out[c] + residual[i * ldr + c]
                                                             : out[c];
    }
}

/* One task per (chunk of rows, panel); `stored` a constant in each inlined copy. */
static inline __attribute__((always_inline)) void panel_linear(
    const float *x, int64_t ldx, const void *w, int stored, const float *bias,
    const float *residual, int64_t ldr, float *y, int64_t rows, int k, int n,
    int num_threads) {
    const int64_t npanels = (n + PANEL - 1) / PANEL;
    /* rows per task: as many as keep their x in L2 (a panel streamed once from memory for
     * them all), in chunks of even size (whole tiles) */
    const int64_t max_chunk = CHUNK_BYTES / ((int64_t)k * 4) > MAX_ROWS
                                  ? CHUNK_BYTES / ((int64_t)k * 4) : MAX_ROWS;
    const int64_t chunks = (rows + max_chunk - 1) / max_chunk;
    const int64_t per_tiles = (rows + chunks - 1) / chunks + MAX_ROWS - 1;
    const int64_t chunk_rows = per_tiles - per_tiles % MAX_ROWS;
    const int64_t panel_bytes = (int64_t)PANEL * k * (stored == PANEL_STORED_F32 ? 4 : 2);
#pragma omp parallel for collapse(2) num_threads(num_threads) schedule(static) \
    if (rows * (int64_t)n * k > 1 << 18)
    for (int64_t ch = 0; ch < chunks; ch++) {
        for (int64_t pi = 0; pi < npanels; pi++) {
            const int64_t c0 = pi * PANEL;
            const int64_t end = rows < (ch + 1) * chunk_rows ? rows : (ch + 1) * chunk_rows;
            const int cols = n - c0 < PANEL ? (int)(n - c0) : PANEL;
            const char *panel = (const char *)w + pi * panel_bytes;
            for (int64_t r = ch * chunk_rows; r < end; r += MAX_ROWS) {
                const int nr = end - r < MAX_ROWS ? (int)(end - r) : MAX_ROWS;
                const float *xr = x + r * ldx;
                const float *b = bias ? bias + c0 : 0;
                const float *res = residual ? residual + r * ldr + c0 : 0;
                float *out = y + r * (int64_t)n + c0;
                switch (nr) { /* one inlined copy per row count */
#define TILE(NR) \
    case NR: tile(xr, ldx, panel, stored, k, NR, b, res, ldr, out, n, cols); break;
                    TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)
#if MAX_ROWS > 6
                    TILE(7) TILE(8) TILE(9) TILE(10) TILE(11) TILE(12)
#endif
#undef TILE
                }
            }
        }
    }
}
#endif

int panel_width(void) {
#ifdef VEC
    return PANEL;
#else
    return 0;
#endif
}

int panel_linear_f32(const float *x, int64_t ldx, const void *w, int stored, const float *bias,
                     const float *residual, int64_t ldr, float *y, int64_t rows, int k, int n,
                     int num_threads) {
#ifdef VEC
    if (stored == PANEL_STORED_F32)
        panel_linear(x, ldx, w, PANEL_STORED_F32, bias, residual, ldr, y, rows, k, n,
                     num_threads);
    else if (stored == PANEL_STORED_BF16)
        panel_linear(x, ldx, w, PANEL_STORED_BF16, bias, residual, ldr, y, rows, k, n,
                     num_threads);
    else
        return -1;
    return 0;
#else
    (void)x, (void)ldx, (void)w, (void)stored, (void)bias, (void)residual, (void)ldr, (void)y;
    (void)rows, (void)k, (void)n, (void)num_threads;
    return -1;
#endif
}
