/* W8A8 linear layer: y[r][c] = sum_g sx[r][g] * sw[c][g] * (xq[r, g] . wq[c, g])
 * (+ bias) (+ residual), where
 *   - wq is quantized once at load (model/linear/int8.py), symmetric, to [-127, 127], one scale
 *     sw[c][G] per output channel and group of WGROUP = 32 input values;
 *   - x is quantized here, per row and per group of GROUP = 32 consecutive values (the
 *     weights' groups: llama.cpp's Q8_0 x Q8_0 shape), symmetric, to [-127, 127] with scale
 *     sx[r][g].
 * Why these scales (docs/quantization-int8.md; measured by benchmarks/int8_error_sources.py,
 * removed after 1e39609): on
 * SmolLM2-135M int8 lost on both sides. The activations: per-token scales cost +4.8%
 * perplexity, per group of 32 +0.8%, of 16 +0.3% (a few channels are 10-40 times the row's
 * rms); with the weights per group of 32 too, activations per 32 measured +0.5% and -0.0%
 * on two texts, and cost half the per-group work of 16: every GROUP products end in a convert
 * and two multiplies, which at 16 held the kernel to about half vpdpbusd's rate. The weights: 7-bit per channel +1.2%, 8-bit per channel +0.1% on one text but +1.0%
 * on another, per group of 32 -0.0% on both (the model's GGUF weights are themselves 4-bit
 * blocks of 32 with their own scales).
 *
 * Each group's dot product is exact in int32 (32 * 255 * 127 < 2^31), converted to fp32 and
 * accumulated with sx * sw; bias and residual come last.
 *
 * Packed weights: NC = 16 output columns at a time ("panels"), K in quads of 4 bytes,
 *   w[(panel * kp / 4 + k / 4) * NC * 4 + j * 4 + k % 4] = wq[panel * NC + j][k] + 128,
 * as uint8 (in [1, 255]; K padded with wq = 0, i.e. 128, to kp, a multiple of 32, and N to
 * whole panels). One quad of a panel is 64 bytes: one AVX-512 vector holds 16 columns x
 * 4 k, and the 4 k of a row's x are broadcast against it (the layout of oneDNN's and
 * llama.cpp's VNNI kernels). The variants, picked by the compiler's macros (build.py builds
 * one library per ISA level):
 *   - AVX512-VNNI: vpdpbusd multiplies the unsigned weights by signed x and adds each 4
 *     products into int32, exactly; the + 128 comes back out per group: 128 * sum(xq).
 *   - AVX-VNNI: the same on 256-bit registers (8 columns each).
 *   - AVX2: vpmaddubsw (u8 x s8, pairs added into int16 with saturation) would overflow on
 *     (w + 128) * x, so it takes llama.cpp's sign trick: |wq| (<= 127) times x carrying wq's
 *     sign (vpsignb), 127 * 127 * 2 fits in int16; vpmaddwd widens the pairs.
 *   - otherwise: the same sums in plain C.
 * All produce the same int32 group sums, so the same fp32 results.
 * Packed weight scales: per panel, per weight group, the NC columns' scales:
 *   w_scales[(panel * kp / WGROUP + G) * NC + j] = sw[panel * NC + j][G]. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#define GROUP 32     /* activation values per scale */
#define WGROUP 32    /* weight values per scale: the same groups */
#define NC 16        /* output columns per panel */
#define ROW_BLOCK 96 /* rows whose quantized x (96 x K bytes) stays in L2 across panels */
#define W_OFFSET 128

/* Per-row, per-group symmetric int8: q = round(x * (127 / max|x|)), scale = max|x| / 127 (1
 * for an all-zero group), padded with zeros to kp. The same fp32 operations as
 * linear/int8.py's reference, so compiled without -ffast-math, which may turn a division
 * into a multiplication by the reciprocal (one ulp off, and a value at a tie then rounds the
 * other way). goffsets: each group's -128 * sum(q), where the VNNI variants' sums start
 * (their + 128 taken back). A whole group is vectorized (as gguf_activations.h's blocks: a
 * max, one division, a product per value, vcvtps2dq's round-to-nearest-even as nearbyintf);
 * a last partial group is not. */
#define EXACT_FP __attribute__((optimize("no-fast-math")))

EXACT_FP static inline float quantize_group_scalar(const float *x, int n, int8_t *q,
                                                   int32_t *sum) {
    float amax = 0.f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    *sum = 0;
    for (int i = 0; i < GROUP; i++) {
        q[i] = i < n ? (int8_t)nearbyintf(x[i] * inv) : 0;
        *sum += q[i];
    }
    return amax > 0.f ? amax / 127.f : 1.f;
}

#if defined(__AVX512F__)
#include <immintrin.h>
EXACT_FP static inline float quantize_group(const float *x, int8_t *q, int32_t *sum) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(q1));
    *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    return amax > 0.f ? amax / 127.f : 1.f;
}
#elif defined(__AVX2__)
#include <immintrin.h>
/* 16 values times inv, rounded, to int8 at q; returns their int32 lanes' sum vector. */
EXACT_FP static inline __m256i quantize16(const float *x, __m256 inv, int8_t *q) {
    const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), inv));
    const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), inv));
    /* int32 -> int8 (|q| <= 127): the packs work per 128-bit lane, so the two 8-byte halves
     * come out as dwords 0, 2 (lane 0) and 4, 6 (lane 1) of packs_epi16(p, p) */
    const __m256i p = _mm256_packs_epi32(q0, q1); /* q0[0..3] q1[0..3] | q0[4..7] q1[4..7] */
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p, p),
                                                  _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5));
    _mm_storeu_si128((__m128i *)q, _mm256_castsi256_si128(b));
    return _mm256_add_epi32(q0, q1);
}

EXACT_FP static inline float quantize_group(const float *x, int8_t *q, int32_t *sum) {
    const __m256 no_sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m8 = _mm256_and_ps(_mm256_loadu_ps(x), no_sign);
    for (int i = 8; i < GROUP; i += 8)
        m8 = _mm256_max_ps(m8, _mm256_and_ps(_mm256_loadu_ps(x + i), no_sign));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
    const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    const __m256i s = _mm256_add_epi32(quantize16(x, inv, q), quantize16(x + 16, inv, q + 16));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    *sum = _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1)));
    return amax > 0.f ? amax / 127.f : 1.f;
}
#else
EXACT_FP static inline float quantize_group(const float *x, int8_t *q, int32_t *sum) {
    return quantize_group_scalar(x, GROUP, q, sum);
}
#endif

EXACT_FP static void quantize_rows(const float *x, int64_t ldx, int8_t *xq, float *gscales,
                                   int32_t *goffsets, int64_t rows, int k, int kp,
                                   int num_threads) {
    const int groups = kp / GROUP;
#pragma omp parallel for num_threads(num_threads) if (rows * k > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        for (int g = 0; g < groups; g++) {
            const int start = g * GROUP, n = k - start < GROUP ? k - start : GROUP;
            int8_t *q = xq + r * kp + start;
            int32_t sum;
            gscales[r * groups + g] = n == GROUP ? quantize_group(xr + start, q, &sum)
                                                 : quantize_group_scalar(xr + start, n, q, &sum);
            goffsets[r * groups + g] = -W_OFFSET * sum;
        }
    }
}

static inline int32_t load_quad(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#include <immintrin.h>
/* A tile is MR rows x NP panels (16 columns each): 12 int32 + 12 fp32 accumulators, per 4 k
 * two weight vectors and MR broadcasts of x for 2 * MR vpdpbusd (8 loads per 12, where one
 * panel of 8 rows took 9 per 8), and each group's rescaling (convert, scale product, FMA)
 * amortised over twice the columns. */
#define MR 6
#define NP 2

/* out[r][j] = sum_g sx[r][g] * sw[j][g] * dot_g for `rows` (1..MR) rows starting at xq
 * and the NC columns of each of `panels` (1..NP) panels at w[i] (scales at ws[i]). Inlined
 * per row and panel count. */
static inline __attribute__((always_inline)) void tile(const int8_t *xq, int64_t kp,
                                                       const float *gs, const int32_t *goff,
                                                       int groups, const uint8_t *const *w,
                                                       const float *const *ws, int rows,
                                                       int panels, float out[MR][NP * NC]) {
    __m512 facc[MR][NP];
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < panels; h++) facc[r][h] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m512i acc[MR][NP]; /* from -128 * sum(xq): the dots come out exact, no subtraction */
        for (int r = 0; r < rows; r++)
            for (int h = 0; h < panels; h++) acc[r][h] = _mm512_set1_epi32(goff[r * groups + g]);
        for (int q = 0; q < GROUP / 4; q++) {
            __m512i wv[NP];
            for (int h = 0; h < panels; h++)
                wv[h] = _mm512_loadu_si512(w[h] + ((int64_t)g * GROUP / 4 + q) * 64);
            for (int r = 0; r < rows; r++) {
                const __m512i xv = _mm512_set1_epi32(load_quad(xq + r * kp + g * GROUP + q * 4));
                for (int h = 0; h < panels; h++)
                    acc[r][h] = _mm512_dpbusd_epi32(acc[r][h], wv[h], xv);
            }
        }
        for (int h = 0; h < panels; h++) {
            const __m512 sw = _mm512_loadu_ps(ws[h] + g * NC);
            for (int r = 0; r < rows; r++)
                facc[r][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][h]),
                                             _mm512_mul_ps(sw, _mm512_set1_ps(gs[r * groups + g])),
                                             facc[r][h]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < panels; h++) _mm512_storeu_ps(out[r] + h * NC, facc[r][h]);
}

#elif defined(__AVX2__)
#include <immintrin.h>
#define MR 3 /* rows per tile: 6 int32 + 6 fp32 accumulators of 8 columns, 2 weight vectors */
#define NP 1

#if defined(__AVXVNNI__)
/* acc += (w + 128) . x per 4 bytes, exact in int32. */
#define DOT_PREPARE(wv) (wv)
#define DOT(acc, wv, xv) _mm256_dpbusd_avx_epi32(acc, wv, xv)
#define DOT_START(goff) _mm256_set1_epi32(goff)
#else
/* acc += wq . x per 4 bytes: |wq| (unsigned) times x with wq's sign, pairs in int16 (at most
 * 2 * 127 * 127), then widened. DOT_PREPARE turns the stored w + 128 into wq. */
#define DOT_PREPARE(wv) _mm256_xor_si256(wv, _mm256_set1_epi8((char)0x80))
#define DOT(acc, wv, xv)                                                                   \
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wv),      \
                                                                 _mm256_sign_epi8(xv, wv)), \
                                            _mm256_set1_epi16(1)))
#define DOT_START(goff) _mm256_setzero_si256()
#endif

static inline __attribute__((always_inline)) void tile(const int8_t *xq, int64_t kp,
                                                       const float *gs, const int32_t *goff,
                                                       int groups, const uint8_t *const *wp,
                                                       const float *const *wsp, int rows,
                                                       int panels, float out[MR][NP * NC]) {
    const uint8_t *w = wp[0]; /* one panel a tile */
    const float *ws = wsp[0];
    (void)panels;
    __m256 facc[MR][2];
    for (int r = 0; r < rows; r++) facc[r][0] = facc[r][1] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m256i acc[MR][2];
        for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = DOT_START(goff[r * groups + g]);
        for (int q = 0; q < GROUP / 4; q++) {
            const uint8_t *wq = w + ((int64_t)g * GROUP / 4 + q) * 64;
            const __m256i w0 = DOT_PREPARE(_mm256_loadu_si256((const __m256i *)wq));
            const __m256i w1 = DOT_PREPARE(_mm256_loadu_si256((const __m256i *)(wq + 32)));
            for (int r = 0; r < rows; r++) {
                const __m256i xv = _mm256_set1_epi32(load_quad(xq + r * kp + g * GROUP + q * 4));
                acc[r][0] = DOT(acc[r][0], w0, xv);
                acc[r][1] = DOT(acc[r][1], w1, xv);
            }
        }
        const __m256 sw[2] = {_mm256_loadu_ps(ws + g * NC),
                              _mm256_loadu_ps(ws + g * NC + 8)};
        for (int r = 0; r < rows; r++) {
            const __m256 sx = _mm256_set1_ps(gs[r * groups + g]);
            for (int h = 0; h < 2; h++)
                facc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][h]),
                                             _mm256_mul_ps(sw[h], sx), facc[r][h]);
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_ps(out[r], facc[r][0]);
        _mm256_storeu_ps(out[r] + 8, facc[r][1]);
    }
}

#else /* another architecture, or x86 below AVX2: the same sums, one product at a time */
#define MR 4
#define NP 1

static void tile(const int8_t *xq, int64_t kp, const float *gs, const int32_t *goff,
                 int groups, const uint8_t *const *wp, const float *const *wsp, int rows,
                 int panels, float out[MR][NP * NC]) {
    const uint8_t *w = wp[0];
    const float *ws = wsp[0];
    (void)panels;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < NC; j++) out[r][j] = 0.f;
    for (int g = 0; g < groups; g++)
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < NC; j++) {
                int32_t dot = 0;
                for (int b = 0; b < GROUP; b++) {
                    const int k = g * GROUP + b;
                    dot += xq[r * kp + k] * (w[(k / 4) * NC * 4 + j * 4 + k % 4] - W_OFFSET);
                }
                out[r][j] =
                    fmaf((float)dot, ws[g * NC + j] * gs[r * groups + g], out[r][j]);
            }
}
#endif

/* y[j] = dots[j] (+ bias[j]) (+ residual[j]) for j < width: a loop per case, each
 * vectorized (one loop testing both per element ran scalar: a tenth of the kernel's time at
 * 64 rows). */
static inline void write_row(const float *dots, int width, const float *bias,
                             const float *residual, float *y) {
    if (bias && residual) {
#pragma omp simd
        for (int j = 0; j < width; j++) y[j] = dots[j] + bias[j] + residual[j];
    } else if (bias) {
#pragma omp simd
        for (int j = 0; j < width; j++) y[j] = dots[j] + bias[j];
    } else if (residual) {
#pragma omp simd
        for (int j = 0; j < width; j++) y[j] = dots[j] + residual[j];
    } else {
        memcpy(y, dots, width * sizeof(float));
    }
}

/* x [rows, k] fp32 (row stride ldx); w and w_scales packed as above for n columns;
 * bias [n] or NULL; residual [rows, n] (row stride ldr) or NULL; y [rows, n] contiguous.
 * scratch: rows * kp bytes for the quantized rows; gscales and gsums: rows * kp / GROUP
 * each, for each row's group scales and -128 times its groups' sums (quantize_rows). */
void int8_linear_f32(const float *x, int64_t ldx, const uint8_t *w, const float *w_scales,
                     const float *bias, const float *residual, int64_t ldr, float *y,
                     int8_t *scratch, float *gscales, int32_t *gsums, int64_t rows, int k,
                     int kp, int n, int num_threads) {
    const int groups = kp / GROUP;
    quantize_rows(x, ldx, scratch, gscales, gsums, rows, k, kp, num_threads);
    const int panels = (n + NC - 1) / NC;
    const int tiles = (panels + NP - 1) / NP; /* NP panels side by side */
    const int64_t panel_bytes = (int64_t)kp * NC;
    /* Each thread takes a contiguous share of the tiles' panels for a block of rows; the
     * panels (NP x NC x K bytes) stay in L1/L2 while the block's rows pass over them. */
#pragma omp parallel num_threads(num_threads) if (rows * (int64_t)n * kp > 1 << 18)
    for (int64_t first = 0; first < rows; first += ROW_BLOCK) {
        const int64_t end = rows < first + ROW_BLOCK ? rows : first + ROW_BLOCK;
#pragma omp for schedule(static) nowait
        for (int t = 0; t < tiles; t++) {
            const int p = t * NP, tile_panels = panels - p < NP ? panels - p : NP;
            const uint8_t *wp[NP];
            const float *ws[NP];
            for (int h = 0; h < tile_panels; h++) {
                wp[h] = w + (p + h) * panel_bytes;
                ws[h] = w_scales + (int64_t)(p + h) * (kp / WGROUP) * NC;
            }
            for (int64_t r = first; r < end; r += MR) {
                float dots[MR][NP * NC];
                const int tile_rows = end - r < MR ? (int)(end - r) : MR;
                const int8_t *xr = scratch + r * kp;
                const float *gs = gscales + r * groups;
                const int32_t *goff = gsums + r * groups;
                /* one inlined copy per row count (and, with NP = 2, per panel count) */
#define TILE(ROWS)                                                                   \
    case ROWS:                                                                       \
        if (NP > 1 && tile_panels == NP)                                             \
            tile(xr, kp, gs, goff, groups, wp, ws, ROWS, NP, dots);                  \
        else                                                                         \
            tile(xr, kp, gs, goff, groups, wp, ws, ROWS, 1, dots);                   \
        break;
                switch (tile_rows) {
                    TILE(1)
#if MR > 1
                    TILE(2)
#endif
#if MR > 2
                    TILE(3)
#endif
#if MR > 3
                    TILE(4)
#endif
#if MR > 4
                    TILE(5)
#endif
#if MR > 5
                    TILE(6)
#endif
#undef TILE
                }
                const int width = n - p * NC < tile_panels * NC ? n - p * NC : tile_panels * NC;
                for (int i = 0; i < tile_rows; i++)
                    write_row(dots[i], width, bias ? bias + p * NC : NULL,
                              residual ? residual + (r + i) * ldr + p * NC : NULL,
                              y + (r + i) * (int64_t)n + p * NC);
            }
        }
    }
}
