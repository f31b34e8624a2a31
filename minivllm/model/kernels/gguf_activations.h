/* GGUF kernels' activations (gguf_gemm.c, gguf_repacked.c): x quantized per row and block of
 * 32 to int8, llama.cpp's q8_0 activations with each half's sum (its q8_1). Both kernels
 * quantize the same way, so a row's int8 values never depend on which kernel runs it. */
#ifndef MINIVLLM_GGUF_ACTIVATIONS_H
#define MINIVLLM_GGUF_ACTIVATIONS_H

#include <math.h>
#include <stdint.h>

#include "gguf_unpack.h"

/* Per-row, per-block symmetric int8 as linear_gguf.quantize_blocks (the same fp32
 * operations: compiled without -ffast-math, see int8_gemm.c's quantize_rows), and the sum
 * of each half block (16 values) of the quantized values. */
__attribute__((optimize("no-fast-math"), unused)) static void quantize_blocks(
    const float *x, int64_t ldx, int8_t *xq, float *xs, int32_t *xsums, int64_t rows, int k,
    int num_threads) {
    const int nb = k / BLOCK;
#pragma omp parallel for num_threads(num_threads) if (rows * k > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        for (int b = 0; b < nb; b++) {
            float amax = 0.f;
#pragma omp simd reduction(max : amax)
            for (int i = 0; i < BLOCK; i++) amax = fmaxf(amax, fabsf(xr[b * BLOCK + i]));
            const float inv = amax > 0.f ? 127.f / amax : 0.f;
            xs[r * nb + b] = amax > 0.f ? amax / 127.f : 1.f;
            int32_t sum[2] = {0, 0};
            for (int i = 0; i < BLOCK; i++) {
                const int8_t q = (int8_t)nearbyintf(xr[b * BLOCK + i] * inv);
                xq[r * k + b * BLOCK + i] = q;
                sum[i >> 4] += q;
            }
            xsums[(r * nb + b) * 2] = sum[0];
            xsums[(r * nb + b) * 2 + 1] = sum[1];
        }
    }
}

#endif
