/* What the two fp32 attention kernels (paged_decode_attention.c, paged_prefill_attention.c)
 * share: a layer's K or V cache as they see it, and reading its rows as fp32: in place from
 * an fp32 cache, else converted into a buffer as they are read (--kv-cache-dtype: bf16
 * widened, int8 and fp8 dequantized with their token's scale). */
#ifndef MINIVLLM_KV_ROWS_H
#define MINIVLLM_KV_ROWS_H

#include <stdint.h>
#include <string.h>

#include "kernels.h"

typedef struct {
    const void *data;    /* [num_blocks, block_size, num_kv_heads, head_dim] of `type` */
    const float *scales; /* [num_blocks, block_size, num_kv_heads]: the quantized types */
    const float *fp8;    /* the 256 values of an fp8 byte: the fp8 types */
    int type;            /* KV_F32 .. KV_FP8_E5M2 (kernels.h) */
} kv_cache;

static inline int kv_quantized(int type) { return type >= KV_INT8; }

/* Bytes per cached value. */
static inline int kv_value_bytes(int type) {
    return type == KV_F32 ? 4 : type == KV_BF16 ? 2 : 1;
}

/* bf16 -> fp32 is exact: the bf16 bits are the fp32's top half. */
static inline void widen_bf16(const uint16_t *restrict src, float *restrict dst, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const uint32_t bits = (uint32_t)src[i] << 16;
        memcpy(dst + i, &bits, sizeof bits);
    }
}

/* n quantized values from element `at` (a multiple of head_dim: rows of whole heads), each
 * head's times its scale. */
static inline void dequantize_rows(kv_cache c, int64_t at, int64_t n, int head_dim,
                                   float *restrict dst) {
    for (int64_t h = 0; h < n / head_dim; h++) {
        const float s = c.scales[at / head_dim + h];
        const int64_t from = at + h * head_dim;
        float *restrict out = dst + h * head_dim;
        if (c.type == KV_INT8) {
            const int8_t *restrict src = (const int8_t *)c.data + from;
#pragma omp simd
            for (int d = 0; d < head_dim; d++) out[d] = (float)src[d] * s;
        } else {
            const uint8_t *restrict src = (const uint8_t *)c.data + from;
            for (int d = 0; d < head_dim; d++) out[d] = c.fp8[src[d]] * s;
        }
    }
}

/* n K/V values (whole head rows) from element offset `at` of a cache, as fp32: in place
 * when fp32, else converted into buf. */
static inline const float *kv_rows(kv_cache c, int64_t at, int64_t n, int head_dim,
                                   float *buf) {
    if (c.type == KV_F32) return (const float *)c.data + at;
    if (c.type == KV_BF16) widen_bf16((const uint16_t *)c.data + at, buf, n);
    else dequantize_rows(c, at, n, head_dim, buf);
    return buf;
}

#endif
