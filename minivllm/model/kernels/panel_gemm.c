/* The linear layer over weights packed once at load into panels of output columns, fp32
 * arithmetic (model/linear/panels.py): fp32 x times weights stored as fp32 or bf16. One tile loop
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
 *   (model/linear/choice.py); from ~128 rows all three are within noise.
 *
 * Layout (linear/panels.py's pack_weight): panels of PANEL = 2 x VEC output columns, k-major.
 * fp32: for each k, the panel's PANEL values in column order (two vector loads). bf16: for
 * each k, PANEL bf16 values in VEC 32-bit words, word j holding column j in its low half and
 * column j + VEC in its high half: one vector load then gives both halves of the panel as
 * fp32 with one shift (column j: the low half moved up) and one and (column j + VEC: the low
 * half cleared), no shuffles.
 *
 * Every output is its k terms accumulated in k order by one FMA chain whatever the number of
 * rows or how they are tiled: a row's result does not depend on the batch it runs in.
 *
 * bf16 dot products (PANEL_STORED_BF16_PAIRS, AVX512-BF16 libraries only: Zen 4/5, Cooper
 * Lake and later Xeons): bf16 weights times x rounded to bf16 (to nearest even, once per
 * call), each pair of products added into fp32 by vdpbf16ps: twice the multiply-adds of an
 * fp32 FMA per instruction, and unlike oneDNN's bf16 linear the output is not rounded to
 * bf16 (so the LM head can run this way, its logits fp32) and bias and residual ride along.
 * Layout: for each pair of k (K padded to even with zeros), the panel's PANEL columns in
 * order, word j holding column j's weights at k (low half) and k + 1 (high half): two
 * vector loads give the operands of 2 x VEC outputs. */
#include <stdint.h>
#include <stdlib.h>

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

/* A tile's accumulators (nr rows, the panel's two halves) to y, bias and residual added. */
static inline __attribute__((always_inline)) void store_rows(
    vf acc[][2], int nr, const float *bias, const float *residual, int64_t ldr, float *y,
    int64_t n, int cols) {
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
    store_rows(acc, nr, bias, residual, ldr, y, n, cols);
}

#ifdef __AVX512BF16__
/* x's rows (fp32, ldx apart) rounded to bf16 into xb (kp per row; K's odd tail padded with
 * a zero). */
static void rows_to_bf16(const float *x, int64_t ldx, uint16_t *xb, int64_t rows, int k,
                         int kp, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * (int64_t)k > 1 << 16)
    for (int64_t r = 0; r < rows; r++) {
        for (int c = 0; c < kp; c += 16) {
            const __mmask16 m = c + 16 <= k ? 0xffff : c < k ? (__mmask16)((1u << (k - c)) - 1) : 0;
            const __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + r * ldx + c));
            const __mmask16 keep = c + 16 <= kp ? 0xffff : (__mmask16)((1u << (kp - c)) - 1);
            _mm256_mask_storeu_epi16(xb + r * kp + c, keep, (__m256i)b);
        }
    }
}

/* tile() for PANEL_STORED_BF16_PAIRS: x's rows as bf16 (xb, kp apart), kp / 2 pairs. */
static inline __attribute__((always_inline)) void tile_pairs(
    const uint16_t *xb, int64_t kp, const char *p, int nr, const float *bias,
    const float *residual, int64_t ldr, float *y, int64_t n, int cols, const char *ahead,
    int64_t ahead_bytes) {
    vf acc[MAX_ROWS][2];
    for (int i = 0; i < nr; i++) acc[i][0] = acc[i][1] = zero();
    for (int64_t kk = 0; kk < kp; kk += 2) {
        _mm_prefetch(p + PREFETCH, _MM_HINT_T0);
        _mm_prefetch(p + PREFETCH + 64, _MM_HINT_T0);
        if (kk * 32 < ahead_bytes) _mm_prefetch(ahead + kk * 32, _MM_HINT_T1);
        const __m512bh lo = (__m512bh)_mm512_loadu_si512((const void *)p);
        const __m512bh hi = (__m512bh)_mm512_loadu_si512((const void *)(p + 64));
        p += PANEL * 4;
        for (int i = 0; i < nr; i++) {
            int32_t pair;
            __builtin_memcpy(&pair, xb + i * kp + kk, 4);
            const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], lo, xv);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], hi, xv);
        }
    }
    store_rows(acc, nr, bias, residual, ldr, y, n, cols);
}
#endif

/* One task per (chunk of rows, panel); `stored` a constant in each inlined copy. For the
 * bf16 pairs, x is their bf16 rows (uint16, ldx = kp apart, k = kp). */
static inline __attribute__((always_inline)) void panel_linear(
    const float *x, int64_t ldx, const void *w, int stored, const float *bias,
    const float *residual, int64_t ldr, float *y, int64_t rows, int k, int n,
    int num_threads) {
    const int64_t npanels = (n + PANEL - 1) / PANEL;
    /* rows per task: as many as keep their x in L2 (a panel streamed once from memory for
     * them all), in chunks of even size (whole tiles) */
    const int64_t max_chunk = CHUNK_BYTES / ((int64_t)k * 4) > MAX_ROWS
                                  ? CHUNK_BYTES / ((int64_t)k * 4) : MAX_ROWS;
    const int64_t per_tiles = (rows + (rows + max_chunk - 1) / max_chunk - 1)
                              / ((rows + max_chunk - 1) / max_chunk) + MAX_ROWS - 1;
    const int64_t chunk_rows = per_tiles - per_tiles % MAX_ROWS;
    /* counted from chunk_rows (rounded up to whole tiles), so that no chunk is empty: an
     * empty one had 0 tiles, and its prefetch share divided by them (SIGFPE: Qwen2.5's
     * down projection, K = 4864, at 97 rows) */
    const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    const int64_t panel_bytes = (int64_t)PANEL * k * (stored == PANEL_STORED_F32 ? 4 : 2);
#pragma omp parallel for collapse(2) num_threads(num_threads) schedule(static) \
    if (rows * (int64_t)n * k > 1 << 18)
    for (int64_t ch = 0; ch < chunks; ch++) {
        for (int64_t pi = 0; pi < npanels; pi++) {
            const int64_t c0 = pi * PANEL;
            const int64_t end = rows < (ch + 1) * chunk_rows ? rows : (ch + 1) * chunk_rows;
            const int cols = n - c0 < PANEL ? (int)(n - c0) : PANEL;
            const char *panel = (const char *)w + pi * panel_bytes;
            const int64_t start = ch * chunk_rows;
            /* bf16 pairs: each tile asks for its share of the next panel's lines, so the
             * first tile over a panel does not wait on memory (SmolLM2's 30 layers, 64
             * rows, Zen 5: 20.8 -> 16.5 ms; at one row no change, at the memory roof) */
            const int64_t tiles = (end - start + MAX_ROWS - 1) / MAX_ROWS;
            const int64_t share = (panel_bytes / tiles + 63) / 64 * 64;
            (void)share; /* unused where there are no pairs */
            for (int64_t r = start; r < end; r += MAX_ROWS) {
                const int nr = end - r < MAX_ROWS ? (int)(end - r) : MAX_ROWS;
                const float *xr = x + r * ldx;
                const float *b = bias ? bias + c0 : 0;
                const float *res = residual ? residual + r * ldr + c0 : 0;
                float *out = y + r * (int64_t)n + c0;
                switch (nr) { /* one inlined copy per row count */
#ifdef __AVX512BF16__
#define TILE_PAIRS(NR)                                                                  \
    if (stored == PANEL_STORED_BF16_PAIRS) {                                            \
        tile_pairs((const uint16_t *)x + r * ldx, ldx, panel, NR, b, res, ldr, out, n, cols, \
                   panel + panel_bytes + (r - start) / MAX_ROWS * share,                \
                   pi + 1 < npanels ? panel_bytes - (r - start) / MAX_ROWS * share : 0); \
        break;                                                                          \
    }
#else
#define TILE_PAIRS(NR)
#endif
#define TILE(NR) \
    case NR: \
        TILE_PAIRS(NR) \
        tile(xr, ldx, panel, stored, k, NR, b, res, ldr, out, n, cols); \
        break;
                    TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)
#if MAX_ROWS > 6
                    TILE(7) TILE(8) TILE(9) TILE(10) TILE(11) TILE(12)
#endif
#undef TILE
#undef TILE_PAIRS
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

int panel_bf16_dot(void) {
#if defined(VEC) && defined(__AVX512BF16__)
    return 1;
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
#ifdef __AVX512BF16__
    else if (stored == PANEL_STORED_BF16_PAIRS) {
        const int kp = k + k % 2;
        uint16_t *xb = malloc((size_t)rows * kp * sizeof *xb);
        if (xb == NULL) return -2;
        rows_to_bf16(x, ldx, xb, rows, k, kp, num_threads);
        panel_linear((const float *)xb, kp, w, PANEL_STORED_BF16_PAIRS, bias, residual, ldr, y,
                     rows, kp, n, num_threads);
        free(xb);
    }
#endif
    else
        return -1;
    return 0;
#else
    (void)x, (void)ldx, (void)w, (void)stored, (void)bias, (void)residual, (void)ldr, (void)y;
    (void)rows, (void)k, (void)n, (void)num_threads;
    return -1;
#endif
}
