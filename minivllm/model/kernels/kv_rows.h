/* What the two fp32 attention kernels (paged_decode_attention.c, paged_prefill_attention.c)
 * share: reading rows of the paged K/V cache as fp32, in place from an fp32 cache, widened
 * into a buffer from a bf16 one (--kv-cache-dtype bfloat16). */
#ifndef MINIVLLM_KV_ROWS_H
#define MINIVLLM_KV_ROWS_H

#include <stdint.h>
#include <string.h>

/* bf16 -> fp32 is exact: the bf16 bits are the fp32's top half. */
static inline void widen_bf16(const uint16_t *restrict src, float *restrict dst, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const uint32_t bits = (uint32_t)src[i] << 16;
        memcpy(dst + i, &bits, sizeof bits);
    }
}

/* n K/V rows of `row` elements from element offset `at` of a cache: in place when fp32,
 * else widened into buf. */
static inline const float *kv_rows(const void *cache, int kv_bf16, int64_t at, int64_t n,
                                   float *buf) {
    if (!kv_bf16) return (const float *)cache + at;
    widen_bf16((const uint16_t *)cache + at, buf, n);
    return buf;
}

#endif
