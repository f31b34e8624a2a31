/* Every function the C kernels export, the one place their signatures are written: a new
 * kernel is its .c file (build.py compiles every one in this folder), its declaration
 * here, and a test.
 *
 * Each .c file includes this header, so the compiler checks every definition's types
 * against it (and -Werror=missing-prototypes rejects an exported function missing here).
 * declarations.py reads it at load time with pycparser: it checks that each definition
 * names its parameters as declared here (a swap of two same-typed arguments passes the
 * compiler), and binds each declaration through cffi, which the *_ops.py wrappers call
 * with keyword arguments named as here.
 *
 * Keep to what crosses into Python: one declaration per function, of scalar types (int,
 * float, double, <stdint.h>'s) or pointers (passed as addresses: tensor.data_ptr(), None
 * for NULL), every parameter named. */
#ifndef MINIVLLM_KERNELS_H
#define MINIVLLM_KERNELS_H

#include <stdint.h>

/* The K/V cache types (kv_type) the attention kernels read and rope_write_kv_f32 writes
 * (--kv-cache-dtype). The quantized ones hold a byte per value and an fp32 scale per token
 * and KV head in k_scales / v_scales [num_blocks, block_size, num_kv_heads] (value =
 * byte's value * scale; NULL for the others); fp8 bytes are read through fp8_values, the
 * fp32 value of each of the 256 bytes (NULL for the others). */
#define KV_F32 0
#define KV_BF16 1
#define KV_INT8 2
#define KV_FP8_E4M3 3
#define KV_FP8_E5M2 4

/* paged_decode_attention.c, paged_prefill_attention.c */
void paged_decode_attention_f32(const float *q, const void *k_cache, const void *v_cache,
                                const float *k_scales, const float *v_scales, int kv_type,
                                const float *fp8_values, const int64_t *block_table,
                                const int64_t *seq_lens, float *out, int num_seqs,
                                int num_heads, int num_kv_heads, int head_dim, int block_size,
                                int max_blocks, int64_t q_stride, float scale, int window,
                                float softcap, int num_threads);
void paged_prefill_attention_f32(const float *q, const void *k_cache, const void *v_cache,
                                 const float *k_scales, const float *v_scales, int kv_type,
                                 const float *fp8_values, const int64_t *block_table,
                                 const int64_t *query_start_loc, const int64_t *seq_lens,
                                 float *out, int num_reqs, int num_heads, int num_kv_heads,
                                 int head_dim, int block_size, int max_blocks,
                                 int64_t q_stride, float scale, int window, float softcap,
                                 int num_threads);

/* amx_attention.c: paged_prefill_attention_f32 for a bf16 cache on AMX-BF16 tiles, without
 * window and softcap; returns 0, or -1 when the library was built without AMX, Linux refused
 * the tiles, memory ran out or head_dim is not a multiple of 32 up to 256 (the caller then
 * runs paged_prefill_attention_f32) */
int paged_prefill_attention_amx(const float *q, const uint16_t *k_cache,
                                const uint16_t *v_cache, const int64_t *block_table,
                                const int64_t *query_start_loc, const int64_t *seq_lens,
                                float *out, int num_reqs, int num_heads, int num_kv_heads,
                                int head_dim, int block_size, int max_blocks, int64_t q_stride,
                                float scale, int num_threads);

/* dpbf16_attention.c: the same for a bf16 cache on AVX-512 BF16 dot products (vdpbf16ps),
 * without window and softcap; returns 0, or -1 when the library was built without
 * AVX512-BF16, memory ran out or head_dim is not a multiple of 16 (the caller then runs
 * paged_prefill_attention_f32) */
int paged_prefill_attention_dpbf16(const float *q, const uint16_t *k_cache,
                                   const uint16_t *v_cache, const int64_t *block_table,
                                   const int64_t *query_start_loc, const int64_t *seq_lens,
                                   float *out, int num_reqs, int num_heads, int num_kv_heads,
                                   int head_dim, int block_size, int max_blocks,
                                   int64_t q_stride, float scale, int num_threads);

/* lora_sgmv.c: a is [segments, r, k], b [segments, r / slots, n] (the block-diagonal B
 * without its zeros: slot t owns columns bounds[t]..bounds[t + 1]); _bf16w: both bf16 */
void lora_sgmv_f32(const float *x, int64_t ldx, float *y, int64_t ldy, const int64_t *rows,
                   const int64_t *seg, int segments, const float *a, const float *b,
                   const int64_t *bounds, int slots, float *h, int k, int r, int n,
                   int num_threads);
void lora_sgmv_bf16w(const float *x, int64_t ldx, float *y, int64_t ldy, const int64_t *rows,
                     const int64_t *seg, int segments, const uint16_t *a, const uint16_t *b,
                     const int64_t *bounds, int slots, float *h, int k, int r, int n,
                     int num_threads);

/* ops.c */
void rms_norm_f32(const float *x, const float *weight, float *out, int64_t rows, int cols,
                  float eps, int num_threads);
void silu_and_mul_f32(const float *x, float *out, int64_t rows, int half, int num_threads);
void rope_write_kv_f32(float *qkv, int64_t row_stride, const int64_t *positions,
                       const float *cos, const float *signed_sin, const int64_t *slots,
                       void *k_cache, void *v_cache, float *k_scales, float *v_scales,
                       int kv_type, const float *fp8_values, int64_t tokens,
                       int num_heads, int num_kv_heads, int head_dim, int num_threads);
void argmax_rows_f32(const float *x, int64_t *out, int64_t rows, int64_t cols,
                     int num_threads);

/* sampler.c */
void sampler_uniforms_f64(const int64_t *keys, const int64_t *positions, double *out,
                          int64_t n);
void sample_rows_f32(float *logits, int64_t rows, int64_t vocab, const float *fparams,
                     const int64_t *iparams, const int64_t *seen_off, const int32_t *seen_ids,
                     const int64_t *pen_off, const int32_t *pen_ids, const float *pen_deltas,
                     const int64_t *ban_off, const int32_t *ban_ids, int64_t *out,
                     int num_threads);

/* int8_gemm.c */
void int8_linear_f32(const float *x, int64_t ldx, const uint8_t *w, const float *w_scales,
                     const float *bias, const float *residual, int64_t ldr, float *y,
                     int8_t *scratch, float *gscales, int32_t *gsums, int64_t rows, int k,
                     int kp, int n, int num_threads);

/* amx_gemm.c: bf16 weights packed as B tiles, int8_gemm.c's packed weights and gguf_gemm.c's
 * blocks on AMX-BF16 tiles, activations in bf16, fp32 out; each returns 0, or -1 when the
 * library was built without AMX, Linux refused the tiles, memory ran out, or (GGUF) the
 * block type is not read (the caller then runs another kernel) */
int bf16_linear_amx_f32(const float *x, int64_t ldx, const uint16_t *w, const float *bias,
                        const float *residual, int64_t ldr, float *y, int64_t rows, int k, int kp,
                        int n, int num_threads);
int int8_linear_amx_f32(const float *x, int64_t ldx, const uint8_t *w, const float *w_scales,
                        const float *bias, const float *residual, int64_t ldr, float *y,
                        int64_t rows, int k, int kp, int n, int num_threads);
int gguf_linear_amx_f32(const float *x, int64_t ldx, const uint8_t *blocks, int qtype,
                        const float *bias, const float *residual, int64_t ldr, float *y,
                        int64_t rows, int k, int n, int num_threads);

/* gguf_gemm.c: returns 0, or -1 for a block type other than Q4_0 / Q4_1 / Q5_0 / Q5_1 /
 * Q8_0 / Q2_K..Q6_K or k not a multiple of its unit (32, or 256 for the K types); the
 * blocks are all it reads of the weights; xsums holds rows * k / 16 ints */
int gguf_linear_f32(const float *x, int64_t ldx, const uint8_t *blocks, int qtype,
                    const float *bias, const float *residual, int64_t ldr, float *y, int8_t *xq,
                    float *xs, int32_t *xsums, int64_t rows, int k, int n, int num_threads);

/* panel_gemm.c: x (fp32) times weights packed by linear/panels.py's pack_weight into panels of
 * panel_width() columns, stored as fp32 or bf16 (`stored`), fp32 arithmetic (AVX2 and
 * AVX-512 libraries; panel_width() is 0 in one without them, and panel_linear_f32 returns
 * -1 there, or for another `stored`) */
#define PANEL_STORED_F32 0
#define PANEL_STORED_BF16 1
#define PANEL_STORED_BF16_PAIRS 2 /* bf16 dot products: AVX512-BF16 only (panel_bf16_dot) */
int panel_width(void);
int panel_bf16_dot(void);
int panel_linear_f32(const float *x, int64_t ldx, const void *w, int stored, const float *bias,
                     const float *residual, int64_t ldr, float *y, int64_t rows, int k, int n,
                     int num_threads);

/* gguf_repack.c, gguf_repacked.c: gguf_gemm.c's product over weights repacked at load
 * into panels of 16 columns (gguf_repacked.h; AVX-512 VNNI and AVX2 libraries:
 * gguf_repacked_supported() says whether this one has them). gguf_repacked_bytes: the
 * repacked size, or 0 for a type (or k) not repacked; gguf_repack and
 * gguf_repacked_linear_f32 return 0, or -1 for such a type or a library without them */
int gguf_repacked_supported(void);
int64_t gguf_repacked_bytes(int qtype, int k, int n);
int gguf_repack(const uint8_t *blocks, int qtype, int k, int n, uint8_t *repacked,
                int num_threads);
int gguf_repacked_linear_f32(const float *x, int64_t ldx, const uint8_t *repacked, int qtype,
                           const float *bias, const float *residual, int64_t ldr, float *y,
                           int8_t *xq, float *xs, int32_t *xsums, int64_t rows, int k, int n,
                           int num_threads);
/* A gate and up linear's [gate | up] weights (n rows, n / 2 a multiple of 16) times x, and
 * y [rows, n / 2] = silu(gate) * up in the same pass (silu_and_mul_f32's values): 0, or -1
 * where it cannot run (a type not repacked, n, or a library whose tiles hold one panel:
 * gguf_repacked_silu_mul_supported() is 0). */
int gguf_repacked_silu_mul_supported(void);
int gguf_repacked_silu_mul_f32(const float *x, int64_t ldx, const uint8_t *repacked, int qtype,
                               float *y, int8_t *xq, float *xs, int32_t *xsums, int64_t rows,
                               int k, int n, int num_threads);

/* gguf_dequant.c: rows [n0, n1) of gguf_gemm.c's blocks (n rows of k values) dequantized
 * to fp32 out [n1 - n0, k], bit for bit as gguf_blocks.py; returns 0, or -1 as
 * gguf_linear_f32 does */
int gguf_dequantize_f32(const uint8_t *blocks, int qtype, int k, int64_t n0, int64_t n1,
                        float *out, int num_threads);

/* isa_info.c: the instruction sets the library was compiled for, bits in the order of
 * isa.py's FEATURES */
int kernels_isa_features(void);

#endif
