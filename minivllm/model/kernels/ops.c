/* Fused per-token operations, fp32, CPU: each replaces one or several torch ops (and their
 * dispatch overhead, which dominates at small batches) with one vectorized pass over the
 * rows. Rows are split over OpenMP threads only when there is enough work to pay for it. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#define PARALLEL_MIN_ELEMENTS 32768

/* out = weight * x / sqrt(mean(x^2) + eps), per row of x [rows, cols]. */
void rms_norm_f32(const float *x, const float *weight, float *out, int64_t rows, int cols,
                  float eps, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * cols > PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *o = out + r * cols, squares = 0.f;
#pragma omp simd reduction(+ : squares)
        for (int c = 0; c < cols; c++) squares += xr[c] * xr[c];
        const float inv = 1.f / sqrtf(squares / cols + eps);
#pragma omp simd
        for (int c = 0; c < cols; c++) o[c] = weight[c] * (xr[c] * inv);
    }
}

/* out = silu(gate) * up, per row of x [rows, 2 * half] = [gate | up]. */
void silu_and_mul_f32(const float *x, float *out, int64_t rows, int half, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * half > PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = x + r * 2 * half, *up = gate + half;
        float *o = out + r * half;
#pragma omp simd
        for (int c = 0; c < half; c++) o[c] = gate[c] / (1.f + expf(-gate[c])) * up[c];
    }
}

/* Rotary embedding of q and k, in place in the fused qkv rows, then k and v written to
 * the paged caches at each token's slot. One thread: the work is small, and the cache's
 * pages are zeroed lazily by the OS, so first writes fault; at batch 64 this op took
 * 9.5 ms per step split over two threads against 2.4 ms on one.
 *   qkv      [tokens, row_stride]: q (num_heads * D) | k (num_kv_heads * D) | v (same)
 *   cos, signed_sin  [max_positions, D]: sin's first half negated, so that
 *            x' = x * cos + roll(x, D / 2) * signed_sin  (transformers' rotate_half)
 *   k/v_cache [num_slots, num_kv_heads * D], of kv_type (kernels.h)
 *   k/v_scales [num_slots, num_kv_heads]: a quantized cache's, one per token and head     */
/* fp32 -> bf16, rounded to nearest even as torch rounds (finite values). */
static inline uint16_t narrow_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

/* The byte of the fp8 value nearest y (|y| <= values[max_code]), ties to the even byte
 * (mantissa), as torch's conversion rounds: a binary search of the 256 values' positive
 * half, which grows with the byte up to max_code, the largest finite one. */
static inline uint8_t encode_fp8(float y, const float *values, int max_code) {
    const float a = fabsf(y);
    int lo = 0, hi = max_code; /* the first byte whose value is >= a */
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (values[mid] < a) lo = mid + 1;
        else hi = mid;
    }
    if (lo > 0) { /* neighbours within a factor of 2: the differences are exact */
        const float below = a - values[lo - 1], above = values[lo] - a;
        if (below < above || (below == above && (lo & 1))) lo--;
    }
    return (uint8_t)(lo | (signbit(y) ? 0x80 : 0));
}

/* One head's head_dim values x quantized into dst, its scale into *scale: kv_quant.py's
 * quantize, the same fp32 operations (scale = absmax * (1 / qmax), x * (qmax / absmax)
 * rounded to the nearest int8 or fp8 value), so that both store the same bytes. Products
 * and one division only: -ffast-math may turn a division by a constant into a product. */
static void quantize_head(const float *x, int head_dim, int kv_type, const float *fp8_values,
                          void *dst, float *scale) {
    const float qmax = kv_type == KV_INT8 ? 127.f : kv_type == KV_FP8_E4M3 ? 448.f : 57344.f;
    float absmax = 0.f;
    for (int d = 0; d < head_dim; d++) absmax = fmaxf(absmax, fabsf(x[d]));
    *scale = absmax * (1.f / qmax);
    const float inv = absmax > 0.f ? qmax / absmax : 0.f;
    if (kv_type == KV_INT8) {
        int8_t *q = dst;
        for (int d = 0; d < head_dim; d++)
            q[d] = (int8_t)rintf(fminf(fmaxf(x[d] * inv, -qmax), qmax));
        return;
    }
    const int max_code = kv_type == KV_FP8_E4M3 ? 0x7E : 0x7B; /* 448, 57344 */
    uint8_t *q = dst;
    for (int d = 0; d < head_dim; d++)
        q[d] = encode_fp8(fminf(fmaxf(x[d] * inv, -qmax), qmax), fp8_values, max_code);
}

void rope_write_kv_f32(float *qkv, int64_t row_stride, const int64_t *positions,
                       const float *cos, const float *signed_sin, const int64_t *slots,
                       void *k_cache, void *v_cache, float *k_scales, float *v_scales,
                       int kv_type, const float *fp8_values, int64_t tokens,
                       int num_heads, int num_kv_heads, int head_dim, int num_threads) {
    const int half = head_dim / 2, heads = num_heads + num_kv_heads;
    const int64_t kv_row = (int64_t)num_kv_heads * head_dim;
    /* tokens are independent (each writes its own slots): split them over the threads */
#pragma omp parallel for num_threads(num_threads) \
    if (tokens * heads * head_dim > PARALLEL_MIN_ELEMENTS)
    for (int64_t t = 0; t < tokens; t++) {
        float *row = qkv + t * row_stride;
        const float *c = cos + positions[t] * head_dim, *s = signed_sin + positions[t] * head_dim;
        for (int h = 0; h < heads; h++) {
            float *x = row + h * head_dim;
            float first[half];
#pragma omp simd
            for (int d = 0; d < half; d++) {
                first[d] = x[d];
                x[d] = x[d] * c[d] + x[d + half] * s[d];
            }
#pragma omp simd
            for (int d = 0; d < half; d++)
                x[d + half] = x[d + half] * c[d + half] + first[d] * s[d + half];
        }
        const float *k = row + (int64_t)num_heads * head_dim, *v = k + kv_row;
        if (kv_type >= KV_INT8) { /* a byte per value, a scale per head */
            for (int h = 0; h < num_kv_heads; h++) {
                const int64_t at = slots[t] * kv_row + h * head_dim;
                const int64_t head = slots[t] * num_kv_heads + h;
                quantize_head(k + h * head_dim, head_dim, kv_type, fp8_values,
                              (uint8_t *)k_cache + at, k_scales + head);
                quantize_head(v + h * head_dim, head_dim, kv_type, fp8_values,
                              (uint8_t *)v_cache + at, v_scales + head);
            }
        } else if (kv_type == KV_BF16) {
            uint16_t *kc = (uint16_t *)k_cache + slots[t] * kv_row;
            uint16_t *vc = (uint16_t *)v_cache + slots[t] * kv_row;
#pragma omp simd
            for (int64_t i = 0; i < kv_row; i++) {
                kc[i] = narrow_bf16(k[i]);
                vc[i] = narrow_bf16(v[i]);
            }
        } else {
            memcpy((float *)k_cache + slots[t] * kv_row, k, kv_row * sizeof(float));
            memcpy((float *)v_cache + slots[t] * kv_row, v, kv_row * sizeof(float));
        }
    }
}

/* Index of each row's largest value, the first one on ties (as torch.argmax), x [rows, cols]:
 * a vectorized max, then a scan for it (torch's argmax does not vectorize). */
void argmax_rows_f32(const float *x, int64_t *out, int64_t rows, int64_t cols,
                     int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * cols > PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float best = xr[0];
#pragma omp simd reduction(max : best)
        for (int64_t c = 0; c < cols; c++) best = xr[c] > best ? xr[c] : best;
        int64_t i = 0;
        while (i < cols - 1 && xr[i] != best) i++;
        out[r] = i;
    }
}
