/* Paged attention for decode steps (one query token per sequence), fp32, CPU.
 *
 * Reads K/V straight from the block pool through each sequence's block table: no padded
 * copy of anyone's context is made, and each K/V row is read once. One task per sequence,
 * all heads together, so every block is read as one contiguous run (and the next one is
 * prefetched while this one is used): the hardware streams it instead of waiting on
 * scattered rows. Softmax is online, one block at a time (running max and sum); no
 * infinities are involved, so it builds with -ffast-math and a vectorized expf.
 *
 * Layouts (contiguous, except q's rows, q_stride floats apart):
 *   q, out       [num_seqs, num_heads, head_dim]
 *   k/v_cache    [num_blocks, block_size, num_kv_heads, head_dim]
 *   block_table  [num_seqs, max_blocks]   (int64)
 *   seq_lens     [num_seqs]               (int64)
 */
#include <math.h>
#include <stdint.h>

static inline void prefetch(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i);
}

/* Inlined into a copy per common head_dim, so that the inner loops have a constant trip
 * count and vectorize without remainders. */
static inline __attribute__((always_inline)) void attend(
    const float *q, const float *k_cache, const float *v_cache, const int64_t *table,
    int64_t len, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
    float *out) {
    const int group = num_heads / num_kv_heads;
    const int64_t row = (int64_t)num_kv_heads * head_dim, block = block_size * row;
    float max[num_heads], sum[num_heads], scores[num_heads][block_size];
    for (int h = 0; h < num_heads; h++) {
        sum[h] = 0.f;
        for (int d = 0; d < head_dim; d++) out[h * head_dim + d] = 0.f;
    }
    for (int64_t start = 0; start < len; start += block_size) {
        const int n = len - start < block_size ? (int)(len - start) : block_size;
        const float *k = k_cache + table[start / block_size] * block;
        const float *v = v_cache + table[start / block_size] * block;
        const int64_t next = start + block_size < len ? table[start / block_size + 1] : -1;
        for (int t = 0; t < n; t++) {
            if (next >= 0) prefetch(k_cache + next * block + t * row, row);
            for (int h = 0; h < num_heads; h++) {
                const float *qh = q + h * head_dim, *kh = k + t * row + h / group * head_dim;
                float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                for (int d = 0; d < head_dim; d++) dot += qh[d] * kh[d];
                scores[h][t] = dot * scale;
            }
        }
        for (int h = 0; h < num_heads; h++) {
            float block_max = start ? max[h] : scores[h][0];
            for (int t = 0; t < n; t++) block_max = fmaxf(block_max, scores[h][t]);
            const float rescale = start ? expf(max[h] - block_max) : 0.f;
            float *p = scores[h], block_sum = 0.f;
#pragma omp simd
            for (int t = 0; t < n; t++) p[t] = expf(p[t] - block_max);
            for (int t = 0; t < n; t++) block_sum += p[t];
            sum[h] = sum[h] * rescale + block_sum;
            max[h] = block_max;
            if (rescale != 1.f)
                for (int d = 0; d < head_dim; d++) out[h * head_dim + d] *= rescale;
        }
        for (int t = 0; t < n; t++) {
            if (next >= 0) prefetch(v_cache + next * block + t * row, row);
            for (int h = 0; h < num_heads; h++) {
                const float p = scores[h][t], *vh = v + t * row + h / group * head_dim;
                float *o = out + h * head_dim;
#pragma omp simd
                for (int d = 0; d < head_dim; d++) o[d] += p * vh[d];
            }
        }
    }
    for (int h = 0; h < num_heads; h++)
        for (int d = 0; d < head_dim; d++) out[h * head_dim + d] /= sum[h];
}

void paged_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache,
                                const int64_t *block_table, const int64_t *seq_lens,
                                float *out, int num_seqs, int num_heads, int num_kv_heads,
                                int head_dim, int block_size, int max_blocks, int64_t q_stride,
                                float scale, int num_threads) {
    const int64_t stride = (int64_t)num_heads * head_dim;
#pragma omp parallel for schedule(dynamic) num_threads(num_threads)
    for (int s = 0; s < num_seqs; s++) {
        const float *qs = q + s * q_stride;
        const int64_t *table = block_table + (int64_t)s * max_blocks;
        float *o = out + s * stride;
#define ATTEND(D) attend(qs, k_cache, v_cache, table, seq_lens[s], num_heads, num_kv_heads, \
                         D, block_size, scale, o)
        switch (head_dim) {
        case 64: ATTEND(64); break;
        case 128: ATTEND(128); break;
        default: ATTEND(head_dim);
        }
    }
}
