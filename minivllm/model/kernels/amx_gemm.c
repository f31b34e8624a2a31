/* Linear layers on AMX-BF16 tiles (Sapphire Rapids and later), fp32 in and out:
 *   - bf16_linear_amx_f32: bf16 weights packed once at load into B tiles (linear/amx.py),
 *     at any batch: dtype=bfloat16's linears and its LM head, whose logits stay fp32 (oneDNN's
 *     bf16 product rounds them to bf16, which tied SmolLM2's top two);
 * and for batches of AMX_MIN_ROWS rows and more (linear_ops.py and gguf_ops.py pick them),
 * over the weights of the two low-bit formats:
 *   - int8_linear_amx_f32: int8_gemm.c's packed int8 weights (q + 128 in panels of 16
 *     columns x 4 input values, one scale per column and group of 32 inputs), where its W8A8
 *     kernel is bound by its per-group rescaling (an int32 -> fp32 conversion and two
 *     multiplies per 32 products; AMX's int8 tiles would need a K of 64 per scale to pay);
 *   - gguf_linear_amx_f32: gguf_gemm.c's GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K blocks as the file
 *     stores them (scales and minima read from the blocks: gguf_scales.h), where its
 *     one-column-at-a-time loop is built for decoding, not for prefill.
 *
 *   y = bf16(x) @ bf16(w).T (+ bias) (+ residual), accumulated in fp32
 *
 * Each call of these two unpacks the weights, a panel of 16 output columns at a time, into
 * AMX's B-tile layout, each value (int8: q * s; GGUF: d * q (+ m)) rounded to bf16 once. The activations
 * are rounded to bf16 (8 significant bits, no grouping to choose) instead of quantized to
 * int8: the same weights as the integer kernels, finer activations (docs/quantization-bf16.md
 * and docs/quantization-int8.md have what each costs on SmolLM2).
 *
 * Tiles: C0..C3 (fp32, 16 x 16) hold 32 rows x 32 columns of y, A0 / A1 (16 rows x 32
 * bf16 of x), B0 / B1 (16 pairs of k x 16 columns x 2, one panel each), so each tile load
 * feeds two TDPBF16PS. A thread takes a pair of panels, unpacks them into its buffer (kp x
 * 16 bf16 each: they stay in L2) if they are not packed already, and passes every 32-row
 * block of x over them.
 *
 * Linux hands a process AMX's tile state only on request (arch_prctl); without it, or
 * without AMX in the build, the functions return -1 and the caller keeps the integer
 * kernels. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define AMX_BUILT
#include "amx_tiles.h"
#include "gguf_scales.h"

#define NC 16          /* output columns per panel (int8_gemm.c's panel width) */
#define WGROUP 32      /* int8_gemm.c's weight group */
#define BLOCK 32       /* GGUF's block */
#define TILE_K 32      /* bf16 values of k per tile row */
#define W_OFFSET 128

/* The weights of one call, and how to have panel p of them as B tiles: kp / 2 rows of 32
 * bf16 (64 bytes), row i holding the 16 columns' values at k = 2i and 2i + 1, zeros for
 * columns past n; unpacked into `scratch` (kp x 16 bf16), or where they already lie. */
typedef struct weights weights;
struct weights {
    const uint16_t *(*panel)(const weights *w, int p, int kp, uint16_t *scratch);
    const uint8_t *data;
    const float *scales; /* int8_gemm.c's */
    int qtype, n;
};

/* bf16 weights packed so at load (linear/amx.py): panel p as it lies. */
static const uint16_t *packed_panel(const weights *w, int p, int kp, uint16_t *scratch) {
    (void)scratch;
    return (const uint16_t *)w->data + (int64_t)p * kp * NC;
}

/* int8_gemm.c's panel p. Within a quad (4 k of 16 columns), column j's 4 values sit in bytes
 * 4j..4j+3; after the conversion to bf16, in the qwords of two vectors (columns 0-7, 8-15):
 * the low dword holds k0 k1, the high k2 k3. even / odd pick those dwords into two B rows. */
static const uint16_t *unpack_int8_panel(const weights *w, int p, int kp, uint16_t *out) {
    const uint8_t *panel = w->data + (int64_t)p * kp * NC;
    const float *ws = w->scales + (int64_t)p * (kp / WGROUP) * NC;
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int g = 0; g < kp / WGROUP; g++) {
        const __m512 s = _mm512_loadu_ps(ws + (int64_t)g * NC);
        __m512 scale[4], shift[4]; /* columns 4h..4h+3, each repeated for its 4 values */
        for (int h = 0; h < 4; h++) {
            const __m512i spread = _mm512_add_epi32(
                _mm512_set1_epi32(4 * h),
                _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
            scale[h] = _mm512_permutexvar_ps(spread, s);
            shift[h] = _mm512_mul_ps(scale[h], _mm512_set1_ps(-(float)W_OFFSET));
        }
        for (int q = g * WGROUP / 4; q < (g + 1) * WGROUP / 4; q++) {
            const uint8_t *quad = panel + (int64_t)q * NC * 4;
            __m512 f[4]; /* (u - 128) * s = u * s - 128 s */
            for (int h = 0; h < 4; h++)
                f[h] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(
                        _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(quad + 16 * h)))),
                    scale[h], shift[h]);
            const __m512i low = (__m512i)_mm512_cvtne2ps_pbh(f[1], f[0]);  /* columns 0-7 */
            const __m512i high = (__m512i)_mm512_cvtne2ps_pbh(f[3], f[2]); /* columns 8-15 */
            _mm512_storeu_si512(out + (int64_t)(2 * q) * 32,
                                _mm512_permutex2var_epi32(low, even, high));
            _mm512_storeu_si512(out + (int64_t)(2 * q + 1) * 32,
                                _mm512_permutex2var_epi32(low, odd, high));
        }
    }
    return out;
}

/* Block b (of 32 values) of a GGUF weight row, d * q (+ m), as bf16 in order: 16 dwords,
 * pair i = values 2i, 2i + 1. Q4_K's block b is the low (b even) or high (b odd) nibbles of
 * 32 bytes of its super-block (gguf_gemm.c's block_values). */
static inline __m512i gguf_block_bf16(const uint8_t *row, int b, int qtype) {
    float ds[8], ms[8];
    gguf_unit_scales(row + (int64_t)(qtype == Q4_K ? (b >> 3) * 144
                                     : b * (qtype == Q8_0 ? 34 : qtype == Q4_0 ? 18 : 20)),
                     qtype, ds, ms);
    const float d = ds[qtype == Q4_K ? b & 7 : 0], m = ms[qtype == Q4_K ? b & 7 : 0];
    __m512 low, high;
    if (qtype == Q4_K) {
        const __m256i packed = _mm256_loadu_si256(
            (const __m256i *)(row + (int64_t)(b >> 3) * 144 + 16 + ((b & 7) >> 1) * 32));
        const __m256i q = _mm256_and_si256(b & 1 ? _mm256_srli_epi16(packed, 4) : packed,
                                           _mm256_set1_epi8(0x0F));
        const __m512 scale = _mm512_set1_ps(d), shift = _mm512_set1_ps(m);
        low = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q))), scale, shift);
        high = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1))), scale,
            shift);
        return (__m512i)_mm512_cvtne2ps_pbh(high, low);
    }
    const uint8_t *block = row + (int64_t)b * (qtype == Q8_0 ? 34 : qtype == Q4_0 ? 18 : 20);
    if (qtype == Q8_0) {
        const __m512 scale = _mm512_set1_ps(d);
        low = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                       _mm_loadu_si128((const __m128i *)(block + 2)))));
        high = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                        _mm_loadu_si128((const __m128i *)(block + 18)))));
    } else { /* Q4_0: d * (nibble - 8); Q4_1: d * nibble + m */
        const __m128i packed = _mm_loadu_si128((const __m128i *)(block + (qtype == Q4_1 ? 4 : 2)));
        const __m128i mask = _mm_set1_epi8(0x0F);
        const __m512 scale = _mm512_set1_ps(d);
        const __m512 shift = _mm512_set1_ps(qtype == Q4_1 ? m : -8.f * d);
        low = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(packed, mask))), scale, shift);
        high = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                   _mm_and_si128(_mm_srli_epi16(packed, 4), mask))),
                               scale, shift);
    }
    return (__m512i)_mm512_cvtne2ps_pbh(high, low);
}

/* Columns 16p..16p+15 of GGUF blocks (n rows of k / 32 blocks): per block of 32 k, the 16
 * columns' values as rows of pairs, transposed into a B tile's 16 rows. */
static const uint16_t *unpack_gguf_panel(const weights *w, int p, int kp, uint16_t *out) {
    const int nb = kp / BLOCK;
    const int64_t row_bytes = w->qtype == Q4_K ? (int64_t)nb / 8 * 144
                              : (int64_t)nb * (w->qtype == Q8_0 ? 34 : w->qtype == Q4_0 ? 18 : 20);
    for (int b = 0; b < nb; b++) {
        __m512i r[16];
        for (int j = 0; j < NC; j++) {
            const int64_t c = (int64_t)p * NC + j;
            r[j] = c < w->n ? gguf_block_bf16(w->data + c * row_bytes, b, w->qtype)
                            : _mm512_setzero_si512();
        }
        transpose_16x16(r);
        for (int i = 0; i < 16; i++) _mm512_storeu_si512(out + ((int64_t)b * 16 + i) * 32, r[i]);
    }
    return out;
}

/* x rows (fp32, stride ldx) to bf16, rows_padded x kp, zeros past k and past rows. */
static void rows_to_bf16(const float *x, int64_t ldx, int64_t rows, int64_t rows_padded, int k,
                         int kp, uint16_t *out, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * k > 65536)
    for (int64_t r = 0; r < rows_padded; r++) {
        uint16_t *o = out + r * kp;
        for (int i = 0; i < kp; i += 16) {
            const int left = r < rows ? (k - i < 16 ? (k - i > 0 ? k - i : 0) : 16) : 0;
            const __m512 v =
                _mm512_maskz_loadu_ps((__mmask16)((1u << left) - 1), (r < rows ? x + r * ldx : x) + i);
            _mm256_storeu_si256((__m256i *)(o + i), (__m256i)_mm512_cvtneps_pbh(v));
        }
    }
}

/* y rows (n apart) from a 32 x 32 block of C: the columns of panels p[0] and p[1] (not
 * p[1]'s when it repeats p[0]) below n, plus bias and residual. */
static void write_rows(float out[2 * ROW_TILE][2 * NC], int64_t valid, const int p[2], int n,
                       const float *bias, const float *residual, int64_t ldr, float *y) {
    for (int h = 0; h < 2 && (h == 0 || p[1] != p[0]); h++) {
        const int col = p[h] * NC, cols = n - col < NC ? n - col : NC;
        const __mmask16 mask = (__mmask16)((1u << cols) - 1);
        const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + col) : _mm512_setzero_ps();
        for (int64_t i = 0; i < valid; i++) {
            __m512 v = _mm512_add_ps(_mm512_loadu_ps(&out[i][h * NC]), b);
            if (residual) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, residual + i * ldr + col));
            _mm512_mask_storeu_ps(y + i * n + col, mask, v);
        }
    }
}

static int amx_linear(const float *x, int64_t ldx, const weights *w, const float *bias,
                      const float *residual, int64_t ldr, float *y, int64_t rows, int k, int kp,
                      int n, int num_threads) {
    if (!amx_permitted()) return -1;
    if (rows == 0) return 0;
    const int64_t rows_padded = (rows + 2 * ROW_TILE - 1) / (2 * ROW_TILE) * (2 * ROW_TILE);
    uint16_t *xb = aligned_alloc(64, (size_t)rows_padded * kp * 2);
    if (!xb) return -1;
    rows_to_bf16(x, ldx, rows, rows_padded, k, kp, xb, num_threads);
    const int panels = (n + NC - 1) / NC, pairs = (panels + 1) / 2;
    const int64_t lda = (int64_t)kp * 2;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) if (rows * (int64_t)n * kp > 1 << 18)
    {
        uint16_t *b = aligned_alloc(64, (size_t)kp * 2 * NC * 2); /* two panels, bf16 */
        if (b)
            configure_tiles();
        else
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
#pragma omp for schedule(static)
        for (int pair = 0; pair < pairs; pair++) {
            if (!b) continue; /* every thread meets the loop; the caller redoes it all */
            /* an odd last panel is paired with itself, its copy's columns not written */
            const int p[2] = {2 * pair, 2 * pair + 1 < panels ? 2 * pair + 1 : 2 * pair};
            const uint16_t *b0 = w->panel(w, p[0], kp, b);
            const uint16_t *b1 = w->panel(w, p[1], kp, b + (int64_t)kp * NC);
            for (int64_t r = 0; r < rows_padded; r += 2 * ROW_TILE) {
                const uint16_t *a = xb + r * kp;
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (int t = 0; t < kp / TILE_K; t++) {
                    _tile_loadd(4, a + t * TILE_K, lda);
                    _tile_loadd(5, a + ROW_TILE * kp + t * TILE_K, lda);
                    _tile_loadd(6, b0 + (int64_t)t * TILE_K * NC, 64);
                    _tile_loadd(7, b1 + (int64_t)t * TILE_K * NC, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
                float out[2 * ROW_TILE][2 * NC];
                _tile_stored(0, &out[0][0], sizeof out[0]);
                _tile_stored(1, &out[0][NC], sizeof out[0]);
                _tile_stored(2, &out[ROW_TILE][0], sizeof out[0]);
                _tile_stored(3, &out[ROW_TILE][NC], sizeof out[0]);
                write_rows(out, rows - r < 2 * ROW_TILE ? rows - r : 2 * ROW_TILE, p, n, bias,
                           residual ? residual + r * ldr : NULL, ldr, y + r * n);
            }
        }
        if (b) {
            _tile_release();
            free(b);
        }
    }
    free(xb);
    return failed ? -1 : 0;
}

#endif

int int8_linear_amx_f32(const float *x, int64_t ldx, const uint8_t *w, const float *w_scales,
                        const float *bias, const float *residual, int64_t ldr, float *y,
                        int64_t rows, int k, int kp, int n, int num_threads) {
#ifdef AMX_BUILT
    const weights weights = {unpack_int8_panel, w, w_scales, 0, n};
    return amx_linear(x, ldx, &weights, bias, residual, ldr, y, rows, k, kp, n, num_threads);
#else /* the callers keep the integer kernels */
    (void)x, (void)ldx, (void)w, (void)w_scales, (void)bias, (void)residual, (void)ldr;
    (void)y, (void)rows, (void)k, (void)kp, (void)n, (void)num_threads;
    return -1;
#endif
}

int bf16_linear_amx_f32(const float *x, int64_t ldx, const uint16_t *w, const float *bias,
                        const float *residual, int64_t ldr, float *y, int64_t rows, int k, int kp,
                        int n, int num_threads) {
#ifdef AMX_BUILT
    const weights weights = {packed_panel, (const uint8_t *)w, NULL, 0, n};
    return amx_linear(x, ldx, &weights, bias, residual, ldr, y, rows, k, kp, n, num_threads);
#else
    (void)x, (void)ldx, (void)w, (void)bias, (void)residual, (void)ldr, (void)y, (void)rows;
    (void)k, (void)kp, (void)n, (void)num_threads;
    return -1;
#endif
}

int gguf_linear_amx_f32(const float *x, int64_t ldx, const uint8_t *blocks, int qtype,
                        const float *bias, const float *residual, int64_t ldr, float *y,
                        int64_t rows, int k, int n, int num_threads) {
#ifdef AMX_BUILT
    if ((qtype != Q8_0 && qtype != Q4_0 && qtype != Q4_1 && qtype != Q4_K) ||
        k % (qtype == Q4_K ? 256 : BLOCK))
        return -1;
    const weights weights = {unpack_gguf_panel, blocks, NULL, qtype, n};
    return amx_linear(x, ldx, &weights, bias, residual, ldr, y, rows, k, k, n, num_threads);
#else
    (void)x, (void)ldx, (void)blocks, (void)qtype, (void)bias;
    (void)residual, (void)ldr, (void)y, (void)rows, (void)k, (void)n, (void)num_threads;
    return -1;
#endif
}
