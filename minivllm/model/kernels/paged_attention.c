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
 *
 * window > 0 (sliding-window layers: Gemma 2/3, Mistral) attends to the last `window`
 * positions only: the blocks before them are never read. softcap > 0 (Gemma 2) squashes
 * each score to softcap * tanh(score / softcap) before the softmax.
 *
 * The K/V cache is fp32, or bf16 with kv_bf16 (--kv-cache-dtype bfloat16): half the bytes
 * to read, which is what decode attention at long contexts waits on. A bf16 block is
 * widened to fp32 in a small per-task buffer as it is read (a shift per element: no bf16
 * arithmetic is needed, and the CPU need not have any), and the math stays fp32.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

static inline void prefetch(const void *p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch((const char *)p + i);
}

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

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VECTOR_DOTS 1
/* The 8 sums of 8 vectors' lanes, as one vector: one transposing reduction for all 8
 * instead of a horizontal sum per score. hadd pairs lanes within each 128-bit half: after
 * two rounds, half 0 of `low` holds vectors 0-3's sums over their half-0 lanes and half 1
 * their half-1 lanes; the same for vectors 4-7 in `high`. Adding the halves gives 0-7. */
static inline __attribute__((always_inline)) __m256 sum8(const __m256 acc[8]) {
    const __m256 low = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]),
                                      _mm256_hadd_ps(acc[2], acc[3]));
    const __m256 high = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]),
                                       _mm256_hadd_ps(acc[6], acc[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20),
                         _mm256_permute2f128_ps(low, high, 0x31));
}

/* The scores of 8 consecutive key rows (`row` floats apart) against q, as one vector: 8
 * accumulators, then one reduction for all 8 (a horizontal sum per score left the decode
 * kernel compute-bound, not bound by the K/V it reads). */
static inline __attribute__((always_inline)) __m256 dot8(const float *q, const float *k,
                                                         int64_t row, int head_dim) {
    __m256 acc[8];
    for (int t = 0; t < 8; t++) acc[t] = _mm256_setzero_ps();
    for (int d = 0; d < head_dim; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        for (int t = 0; t < 8; t++)
            acc[t] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + t * row + d), acc[t]);
    }
    return sum8(acc);
}

/* o[0, head_dim) += sum over t < n of p[t] * v[t * row + ...], 64 dims at a time held in
 * registers across the rows (not loaded and stored back per row). */
static inline __attribute__((always_inline)) void accumulate_values(
    float *o, const float *p, const float *v, int64_t row, int n, int head_dim) {
    for (int d0 = 0; d0 < head_dim; d0 += 64) {
        const int vectors = head_dim - d0 < 64 ? (head_dim - d0) / 8 : 8;
        __m256 acc[8];
        for (int i = 0; i < vectors; i++) acc[i] = _mm256_loadu_ps(o + d0 + 8 * i);
        for (int t = 0; t < n; t++) {
            const __m256 pt = _mm256_set1_ps(p[t]);
            for (int i = 0; i < vectors; i++)
                acc[i] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(v + t * row + d0 + 8 * i), acc[i]);
        }
        for (int i = 0; i < vectors; i++) _mm256_storeu_ps(o + d0 + 8 * i, acc[i]);
    }
}
#endif

/* One head's scores of a run of n positions (raw dot products in p) into its online
 * softmax: p becomes the run's unnormalized probabilities, and the head's running max, sum
 * and output o (unnormalized) are brought to the run's max. */
static inline __attribute__((always_inline)) void softmax_run(
    float *p, int n, float scale, float softcap, int first_run, float *max, float *sum,
    float *o, int head_dim) {
    for (int t = 0; t < n; t++)
        p[t] = softcap > 0.f ? softcap * tanhf(p[t] * scale / softcap) : p[t] * scale;
    float run_max = first_run ? p[0] : *max;
    for (int t = 0; t < n; t++) run_max = fmaxf(run_max, p[t]);
    const float rescale = first_run ? 0.f : expf(*max - run_max);
    float run_sum = 0.f;
#pragma omp simd
    for (int t = 0; t < n; t++) p[t] = expf(p[t] - run_max);
    for (int t = 0; t < n; t++) run_sum += p[t];
    *sum = *sum * rescale + run_sum;
    *max = run_max;
    if (rescale != 1.f)
        for (int d = 0; d < head_dim; d++) o[d] *= rescale;
}

/* The length of the run of positions from `start` to the end of its block, or of the
 * context: the positions a decode kernel reads as one contiguous piece of the cache. */
static inline int64_t run_length(int64_t start, int64_t len, int block_size) {
    const int64_t to_block_end = block_size - start % block_size;
    return len - start < to_block_end ? len - start : to_block_end;
}

/* A sequence's outputs and softmax sums before its first run ... */
static inline __attribute__((always_inline)) void zero_heads(float *out, float *sum,
                                                             int num_heads, int head_dim) {
    for (int h = 0; h < num_heads; h++) {
        sum[h] = 0.f;
        for (int d = 0; d < head_dim; d++) out[h * head_dim + d] = 0.f;
    }
}

/* ... and after its last: each head's output divided by its sum. */
static inline __attribute__((always_inline)) void normalize_heads(float *out, const float *sum,
                                                                  int num_heads, int head_dim) {
    for (int h = 0; h < num_heads; h++)
        for (int d = 0; d < head_dim; d++) out[h * head_dim + d] /= sum[h];
}

/* Inlined into a copy per common head_dim, so that the inner loops have a constant trip
 * count and vectorize without remainders. A run of positions within one block is read as
 * a whole: its K rows give every head's scores (8 rows at a time with AVX2), then its V
 * rows every head's output, so both stay in L1 while the heads sharing them pass. */
static inline __attribute__((always_inline)) void attend(
    const float *q, const void *k_cache, const void *v_cache, int kv_bf16, const int64_t *table,
    int64_t len, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
    int window, float softcap, float *out, float *k_buf, float *v_buf) {
    const int group = num_heads / num_kv_heads;
    const int64_t row = (int64_t)num_kv_heads * head_dim, block = block_size * row;
    const int64_t row_bytes = row * (kv_bf16 ? 2 : 4), block_bytes = block_size * row_bytes;
    float max[num_heads], sum[num_heads], scores[num_heads][block_size];
    zero_heads(out, sum, num_heads, head_dim);
    const int64_t first = window > 0 && len > window ? len - window : 0;
    for (int64_t start = first, n; start < len; start += n) {
        n = run_length(start, len, block_size);
        const int64_t at = table[start / block_size] * block + start % block_size * row;
        const float *k = kv_rows(k_cache, kv_bf16, at, n * row, k_buf);
        const float *v = kv_rows(v_cache, kv_bf16, at, n * row, v_buf);
        const int64_t next = start + n < len ? table[start / block_size + 1] : -1;
        /* the next block's K and V lines, a share per head, while this block is used */
        const int64_t share = (block_bytes / num_heads + 63) / 64 * 64;
        for (int h = 0; h < num_heads; h++) {
            if (next >= 0 && h * share < block_bytes)
                prefetch((const char *)k_cache + next * block_bytes + h * share,
                         share < block_bytes - h * share ? share : block_bytes - h * share);
            const float *qh = q + h * head_dim, *kh = k + h / group * head_dim;
            int t = 0;
#ifdef VECTOR_DOTS
            if (head_dim % 8 == 0)
                for (; t + 8 <= n; t += 8)
                    _mm256_storeu_ps(scores[h] + t, dot8(qh, kh + t * row, row, head_dim));
#endif
            for (; t < n; t++) {
                float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                for (int d = 0; d < head_dim; d++) dot += qh[d] * kh[t * row + d];
                scores[h][t] = dot;
            }
        }
        for (int h = 0; h < num_heads; h++)
            softmax_run(scores[h], n, scale, softcap, start == first, &max[h], &sum[h],
                        out + h * head_dim, head_dim);
        for (int h = 0; h < num_heads; h++) {
            if (next >= 0 && h * share < block_bytes)
                prefetch((const char *)v_cache + next * block_bytes + h * share,
                         share < block_bytes - h * share ? share : block_bytes - h * share);
            const float *vh = v + h / group * head_dim;
            float *o = out + h * head_dim;
#ifdef VECTOR_DOTS
            if (head_dim % 8 == 0) {
                accumulate_values(o, scores[h], vh, row, n, head_dim);
                continue;
            }
#endif
            for (int t = 0; t < n; t++) {
                const float p = scores[h][t];
#pragma omp simd
                for (int d = 0; d < head_dim; d++) o[d] += p * vh[t * row + d];
            }
        }
    }
    normalize_heads(out, sum, num_heads, head_dim);
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define WIDE_DECODE 1
/* The AVX-512 decode kernel, for head_dim a multiple of 16. Measured against the AVX2 one
 * above on SmolLM's shape (9 heads sharing 3 K/V heads), it differs in three ways:
 *  - a bf16 cache is widened in registers as it is loaded (a zero-extend and a shift),
 *    not in a buffer pass first;
 *  - the query heads sharing a K/V head are scored together, up to GB at a time: each K
 *    and V vector is loaded (and widened) once for all of them, not once per head;
 *  - 16 lanes per vector;
 *  - one online-softmax step per CHUNK positions, not per block (see attend_wide).
 * Over 8 layers' caches (out of L3), 64 sequences x 192 positions, bf16 cache: 0.53 ms a
 * layer against 0.81 (AVX2 kernel, same library), ~18 GB/s: this machine's DRAM bandwidth.
 * With an fp32 cache both are at that bandwidth. */
#define GB 3     /* heads scored together: GB x 8 accumulators of the 32 registers */
#define CHUNK 64 /* positions per online-softmax step */

/* 16 elements of a K/V cache from element `at`, as fp32 */
static inline __attribute__((always_inline)) __m512 kv16(const void *cache, int kv_bf16,
                                                         int64_t at) {
    if (!kv_bf16) return _mm512_loadu_ps((const float *)cache + at);
    const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)cache + at));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* scores[j][0..8) = q_j . k_t for the nh (<= GB) heads j from q and the 8 key rows t from
 * element `at` (`row` apart): GB x 8 accumulators, each K vector loaded once for all. */
static inline __attribute__((always_inline)) void scores8_wide(
    const float *q, int nh, const void *k_cache, int kv_bf16, int64_t at, int64_t row,
    int head_dim, float *scores, int scores_stride) {
    __m512 acc[GB][8];
    for (int j = 0; j < GB; j++)
        for (int t = 0; t < 8; t++) acc[j][t] = _mm512_setzero_ps();
    for (int d = 0; d < head_dim; d += 16)
        for (int t = 0; t < 8; t++) {
            const __m512 k = kv16(k_cache, kv_bf16, at + t * row + d);
            for (int j = 0; j < nh; j++)
                acc[j][t] = _mm512_fmadd_ps(k, _mm512_loadu_ps(q + j * head_dim + d), acc[j][t]);
        }
    for (int j = 0; j < nh; j++) {
        __m256 halves[8]; /* each vector's two halves added: the AVX2 reduction then */
        for (int t = 0; t < 8; t++)
            halves[t] = _mm256_add_ps(_mm512_castps512_ps256(acc[j][t]),
                                      _mm512_extractf32x8_ps(acc[j][t], 1));
        _mm256_storeu_ps(scores + j * scores_stride, sum8(halves));
    }
}

/* out_j[0..head_dim) += sum over t < n of p_j[t] * v_t for the nh heads j: 64 dims at a
 * time in registers, each V vector loaded once for all heads. */
static inline __attribute__((always_inline)) void values_wide(
    float *out, int nh, const float *p, int p_stride, const void *v_cache, int kv_bf16,
    int64_t at, int64_t row, int n, int head_dim) {
    for (int d0 = 0; d0 < head_dim; d0 += 64) {
        const int vectors = head_dim - d0 < 64 ? (head_dim - d0) / 16 : 4;
        __m512 acc[GB][4];
        for (int j = 0; j < nh; j++)
            for (int i = 0; i < vectors; i++)
                acc[j][i] = _mm512_loadu_ps(out + j * head_dim + d0 + 16 * i);
        for (int t = 0; t < n; t++) {
            __m512 v[4];
            for (int i = 0; i < vectors; i++)
                v[i] = kv16(v_cache, kv_bf16, at + t * row + d0 + 16 * i);
            for (int j = 0; j < nh; j++) {
                const __m512 pt = _mm512_set1_ps(p[j * p_stride + t]);
                for (int i = 0; i < vectors; i++) acc[j][i] = _mm512_fmadd_ps(pt, v[i], acc[j][i]);
            }
        }
        for (int j = 0; j < nh; j++)
            for (int i = 0; i < vectors; i++)
                _mm512_storeu_ps(out + j * head_dim + d0 + 16 * i, acc[j][i]);
    }
}

/* scores8_wide / values_wide with the head count nh (1..GB) as a constant, so that the
 * accumulators stay registers. */
#define WITH_HEADS(nh, call)        \
    do {                            \
        if ((nh) == GB) call(GB);   \
        else if ((nh) == 2) call(2); \
        else call(1);               \
    } while (0)

/* attend() with the wide kernels: CHUNK positions per online-softmax step (a chunk spans
 * blocks: with 16-position blocks, a step per block spent as long on the softmax
 * bookkeeping as on the dot products), K/V head by K/V head, its query heads GB at a time.
 * No software prefetch: measured over a cache of several layers (out of L3), the hardware
 * prefetcher keeps this at the memory's bandwidth, and prefetching the next block made it
 * slower. */
static inline __attribute__((always_inline)) void attend_wide(
    const float *q, const void *k_cache, const void *v_cache, int kv_bf16, const int64_t *table,
    int64_t len, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
    int window, float softcap, float *out) {
    const int group = num_heads / num_kv_heads;
    const int64_t row = (int64_t)num_kv_heads * head_dim, block = block_size * row;
    float max[num_heads], sum[num_heads], scores[num_heads][CHUNK];
    zero_heads(out, sum, num_heads, head_dim);
    const int64_t first = window > 0 && len > window ? len - window : 0;
    for (int64_t start = first, span; start < len; start += span) {
        span = len - start < CHUNK ? len - start : CHUNK;
        const int64_t end = start + span;
        for (int g = 0; g < num_kv_heads; g++)
            for (int h = g * group; h < (g + 1) * group; h += GB) {
                const int nh = (g + 1) * group - h < GB ? (g + 1) * group - h : GB;
                const float *qh = q + h * head_dim;
                for (int64_t pos = start, n; pos < end; pos += n) { /* the chunk's scores */
                    n = run_length(pos, end, block_size);
                    const int64_t at = table[pos / block_size] * block
                                       + pos % block_size * row + g * head_dim;
                    float *s = &scores[h][pos - start];
                    int t = 0;
#define SCORES8(NH) \
    scores8_wide(qh, NH, k_cache, kv_bf16, at + t * row, row, head_dim, s + t, CHUNK)
                    for (; t + 8 <= n; t += 8) WITH_HEADS(nh, SCORES8);
                    for (; t < n; t++)
                        for (int j = 0; j < nh; j++) {
                            __m512 acc = _mm512_setzero_ps();
                            for (int d = 0; d < head_dim; d += 16)
                                acc = _mm512_fmadd_ps(kv16(k_cache, kv_bf16, at + t * row + d),
                                                      _mm512_loadu_ps(qh + j * head_dim + d),
                                                      acc);
                            s[j * CHUNK + t] = _mm512_reduce_add_ps(acc);
                        }
                }
                for (int j = 0; j < nh; j++)
                    softmax_run(scores[h + j], span, scale, softcap, start == first, &max[h + j],
                                &sum[h + j], out + (h + j) * head_dim, head_dim);
                for (int64_t pos = start, n; pos < end; pos += n) { /* and its values */
                    n = run_length(pos, end, block_size);
                    const int64_t at = table[pos / block_size] * block
                                       + pos % block_size * row + g * head_dim;
#define VALUES(NH)                                                                          \
    values_wide(out + h * head_dim, NH, &scores[h][pos - start], CHUNK, v_cache, kv_bf16, at, \
                row, n, head_dim)
                    WITH_HEADS(nh, VALUES);
                }
            }
    }
    normalize_heads(out, sum, num_heads, head_dim);
}
#endif

void paged_decode_attention_f32(const float *q, const void *k_cache, const void *v_cache,
                                int kv_bf16, const int64_t *block_table,
                                const int64_t *seq_lens, float *out, int num_seqs,
                                int num_heads, int num_kv_heads, int head_dim, int block_size,
                                int max_blocks, int64_t q_stride, float scale, int window,
                                float softcap, int num_threads) {
    const int64_t stride = (int64_t)num_heads * head_dim;
#ifdef WIDE_DECODE
    const int wide = head_dim % 16 == 0;
#else
    const int wide = 0;
#endif
    /* a block's K and V widened from bf16, per thread (none with an fp32 cache, nor for
     * the wide kernel, which widens in registers) */
    const size_t buf_len = kv_bf16 && !wide ? (size_t)block_size * num_kv_heads * head_dim : 0;
#pragma omp parallel num_threads(num_threads)
    {
    float *k_buf = buf_len ? malloc(2 * buf_len * sizeof(float)) : NULL;
    float *v_buf = k_buf ? k_buf + buf_len : NULL;
    if (buf_len && k_buf == NULL) abort();
#pragma omp for schedule(dynamic)
    for (int s = 0; s < num_seqs; s++) {
        const float *qs = q + s * q_stride;
        const int64_t *table = block_table + (int64_t)s * max_blocks;
        float *o = out + s * stride;
#ifdef WIDE_DECODE
        /* the cache's dtype as a constant too: a copy per (head_dim, dtype) */
#define ATTEND_WIDE(D, BF16) attend_wide(qs, k_cache, v_cache, BF16, table, seq_lens[s],    \
                                         num_heads, num_kv_heads, D, block_size, scale,   \
                                         window, softcap, o)
        if (wide) {
            if (head_dim == 64) {
                if (kv_bf16) ATTEND_WIDE(64, 1); else ATTEND_WIDE(64, 0);
            } else if (head_dim == 128) {
                if (kv_bf16) ATTEND_WIDE(128, 1); else ATTEND_WIDE(128, 0);
            } else {
                ATTEND_WIDE(head_dim, kv_bf16);
            }
            continue;
        }
#endif
#define ATTEND(D) attend(qs, k_cache, v_cache, kv_bf16, table, seq_lens[s], num_heads, \
                         num_kv_heads, D, block_size, scale, window, softcap, o, k_buf, v_buf)
        switch (head_dim) {
        case 64: ATTEND(64); break;
        case 128: ATTEND(128); break;
        default: ATTEND(head_dim);
        }
    }
    free(k_buf);
    }
}

/* ==========================================================================================
 * Paged attention for prefill steps (several new tokens per request: a prompt, or a chunk
 * of one on top of tokens already cached), causal by position, fp32 math, CPU; a bf16
 * K/V cache is widened a step (KT rows) at a time, as in the decode kernel.
 *
 * Request p has query_len = query_start_loc[p + 1] - query_start_loc[p] new tokens, the
 * last ones of its seq_lens[p] positions: its query i sits at position
 * seq_lens[p] - query_len + i and attends to positions 0..that one, or to the last `window`
 * of them when window > 0 (the item's walk then starts at its first query's window, and
 * each row masks what lies before its own); softcap as in the decode kernel.
 *
 * Work is split into items (request, kv head, tile of consecutive queries). An item's rows
 * are its queries times the group = num_heads / num_kv_heads query heads that share the kv
 * head, so one pass over the context's K/V serves them all: each K/V row is read once per
 * item, not once per query and head. The context is walked KT tokens at a time through
 * the block table (a step may span blocks of any size), K and V read in place.
 *
 * The item keeps its rows along the vector lanes: queries, scores and outputs are stored
 * transposed ([head_dim][rows], [KT][rows]), so that both products are vectors of rows
 * times a broadcast K or V element, with register-blocked accumulators, and the online
 * softmax (running max and sum per row, as in the decode kernel above) is elementwise
 * vector work, 16 rows at a time with AVX-512, not a scalar loop per row. Causality costs a
 * mask only on the steps that reach past the item's first query position. No dense mask
 * and no copy of the context are made. Each item is one thread's work from start to end,
 * so the result does not depend on the number of threads.
 *
 * Layouts (contiguous, except q's rows, q_stride floats apart):
 *   q, out           [num_tokens, num_heads, head_dim]
 *   k/v_cache        [num_blocks, block_size, num_kv_heads, head_dim]
 *   block_table      [num_reqs, max_blocks]   (int64)
 *   query_start_loc  [num_reqs + 1]           (int64, from 0)
 *   seq_lens         [num_reqs]               (int64)
 * ========================================================================================== */
#include <float.h>
#include <stdlib.h>
#include <string.h>

/* Sizes, measured on AVX-512 (Zen 5): a register block of NR x TB (or NR x DB) vector
 * accumulators beats NR = 1 by ~15%, as each broadcast K or V element then feeds NR FMAs;
 * 128 rows per item spill the item's queries and outputs out of L1. A vector is one
 * hardware register (wider generic vectors compile to slow code), and a block of
 * accumulators must fit the register file: 32 registers with AVX-512, 16 with AVX2. */
#if defined(__AVX512F__)
#define VL 16 /* rows per vector */
#define NR 2  /* row vectors per register block of both products */
#elif defined(__AVX__)
#define VL 8
#define NR 1
#else /* SSE, NEON */
#define VL 4
#define NR 1
#endif
#define KT 16   /* context tokens per step */
#define TB 8    /* tokens per register block of the score product */
#define DB 8    /* head dims per register block of the value product */
#define ROWS 64 /* target rows per item (queries x group): each K/V element serves ~64 rows */
_Static_assert(KT % TB == 0, "a step is a whole number of score blocks");

/* GCC/Clang vector extensions: explicit vectors, so that the accumulators of a register
 * block are registers, whatever the compiler's loop vectorizer decides. */
typedef float vf __attribute__((vector_size(VL * sizeof(float))));

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v); /* an unaligned vector load */
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* s[t][r] = sum_d qt[d][r] * k[t][d] for the step's KT tokens and rows r..r + nr * VL:
 * nr x TB vector accumulators, each K element broadcast once for nr row vectors. */
static inline __attribute__((always_inline)) void scores_block(
    const float *restrict qt, const float *const *restrict k, float *restrict s, int rows,
    int head_dim, int r, int nr) {
    for (int t = 0; t < KT; t += TB) {
        vf a[NR][TB] = {{{0}}};
        for (int d = 0; d < head_dim; d++) {
            vf x[NR];
#pragma GCC unroll 8
            for (int i = 0; i < nr; i++) x[i] = load(qt + d * rows + r + i * VL);
#pragma GCC unroll 16
            for (int b = 0; b < TB; b++) {
                const float kb = k[t + b][d];
#pragma GCC unroll 8
                for (int i = 0; i < nr; i++) a[i][b] += kb * x[i];
            }
        }
#pragma GCC unroll 16
        for (int b = 0; b < TB; b++)
#pragma GCC unroll 8
            for (int i = 0; i < nr; i++) store(s + (t + b) * rows + r + i * VL, a[i][b]);
    }
}

/* s[t][r] = q[r] . k[t] (q already scaled) for the step's KT tokens and all (padded) rows. */
static inline __attribute__((always_inline)) void step_scores(
    const float *restrict qt, const float *const *restrict k, float *restrict s, int rows,
    int head_dim) {
    int r = 0;
    for (; r + NR * VL <= rows; r += NR * VL) scores_block(qt, k, s, rows, head_dim, r, NR);
    for (; r < rows; r += VL) scores_block(qt, k, s, rows, head_dim, r, 1);
}

/* ot[d][r] += sum_t v[t][d] * p[t][r] for the step's KT tokens, dims d..d + nd and rows
 * r..r + nr * VL: nr x nd vector accumulators. */
static inline __attribute__((always_inline)) void values_block(
    const float *restrict p, const float *const *restrict v, float *restrict ot, int rows,
    int r, int nr, int d, int nd) {
    vf a[NR][DB];
#pragma GCC unroll 16
    for (int b = 0; b < nd; b++)
#pragma GCC unroll 8
        for (int i = 0; i < nr; i++) a[i][b] = load(ot + (d + b) * rows + r + i * VL);
    for (int t = 0; t < KT; t++) {
        vf x[NR];
#pragma GCC unroll 8
        for (int i = 0; i < nr; i++) x[i] = load(p + t * rows + r + i * VL);
#pragma GCC unroll 16
        for (int b = 0; b < nd; b++) {
            const float vb = v[t][d + b];
#pragma GCC unroll 8
            for (int i = 0; i < nr; i++) a[i][b] += vb * x[i];
        }
    }
#pragma GCC unroll 16
    for (int b = 0; b < nd; b++)
#pragma GCC unroll 8
        for (int i = 0; i < nr; i++) store(ot + (d + b) * rows + r + i * VL, a[i][b]);
}

/* ot[d][r] += sum_t p[t][r] * v[t][d] for the step's KT tokens and all (padded) rows. */
static inline __attribute__((always_inline)) void step_values(
    const float *restrict p, const float *const *restrict v, float *restrict ot, int rows,
    int head_dim) {
    int r = 0;
    for (; r + NR * VL <= rows; r += NR * VL) {
        int d = 0;
        for (; d + DB <= head_dim; d += DB) values_block(p, v, ot, rows, r, NR, d, DB);
        for (; d < head_dim; d++) values_block(p, v, ot, rows, r, NR, d, 1); /* tail */
    }
    for (; r < rows; r += VL) {
        int d = 0;
        for (; d + DB <= head_dim; d += DB) values_block(p, v, ot, rows, r, 1, d, DB);
        for (; d < head_dim; d++) values_block(p, v, ot, rows, r, 1, d, 1);
    }
}

/* Per-thread scratch, sized for the largest item; rows are padded to a multiple of VL. */
typedef struct {
    float *qt;      /* [head_dim][rows] the item's queries, times scale */
    float *ot;      /* [head_dim][rows] unnormalized outputs */
    float *s;       /* [KT][rows] a step's scores, then probabilities */
    float *max;     /* [rows] running max */
    float *sum;     /* [rows] running sum of exp */
    float *rescale; /* [rows] a step's correction of the running sum and outputs */
    int *query;     /* [rows] the row's query within the item */
    float *zero;    /* [head_dim] zeros: the K and V rows of tokens past the context */
    float *wide;    /* [2][KT][head_dim] a step's K and V rows widened from a bf16 cache */
    const float *k[KT], *v[KT]; /* a step's key and value rows */
} scratch;

/* One item: queries 0..nq at positions first_pos + i, kv head g. q points at query 0, head 0;
 * out likewise. Row r is query r / group of head g * group + r % group. */
static void prefill_item(
    const float *q, const void *k_cache, const void *v_cache, int kv_bf16, const int64_t *table,
    int64_t first_pos, int nq, int g, int num_heads, int num_kv_heads, int head_dim,
    int block_size, int64_t q_stride, float scale, int window, float softcap, float *out,
    scratch *w) {
    const int group = num_heads / num_kv_heads, used = nq * group;
    const int rows = (used + VL - 1) / VL * VL;
    const int64_t row = (int64_t)num_kv_heads * head_dim, block = block_size * row;
    const int64_t len = first_pos + nq; /* the context the last query sees */
    float *restrict qt = w->qt, *restrict ot = w->ot, *restrict s = w->s;
    for (int r = 0; r < rows; r++) {
        if (r < used) {
            const float *src = q + (r / group) * q_stride + (g * group + r % group) * head_dim;
            for (int d = 0; d < head_dim; d++) qt[d * rows + r] = src[d] * scale;
        } else { /* padding: a zero query, its output dropped */
            for (int d = 0; d < head_dim; d++) qt[d * rows + r] = 0.f;
        }
        for (int d = 0; d < head_dim; d++) ot[d * rows + r] = 0.f;
        w->sum[r] = 0.f;
        w->query[r] = r < used ? r / group : nq - 1;
    }
    const int64_t lo = window > 0 && first_pos >= window ? first_pos - window + 1 : 0;
    for (int64_t start = lo; start < len; start += KT) {
        for (int t = 0; t < KT; t++) {
            const int64_t pos = start + t;
            if (pos < len) {
                const int64_t at = table[pos / block_size] * block + pos % block_size * row
                                   + g * head_dim;
                float *wide = w->wide + t * head_dim;
                w->k[t] = kv_rows(k_cache, kv_bf16, at, head_dim, wide);
                w->v[t] = kv_rows(v_cache, kv_bf16, at, head_dim, wide + KT * head_dim);
            } else {
                w->k[t] = w->v[t] = w->zero;
            }
        }
        step_scores(qt, w->k, s, rows, head_dim);
        if (softcap > 0.f)
            for (int i = 0; i < KT * rows; i++) s[i] = softcap * tanhf(s[i] / softcap);
        /* Row r sees token t iff start + t <= first_pos + query[r]. Every row sees the
         * tokens up to first_pos; a step reaching past it (the diagonal, and the tokens
         * past the context in the last step) drops what each row must not see. */
        if (start + KT - 1 > first_pos)
            for (int t = 0; t < KT; t++) {
                const int64_t limit = start + t - first_pos; /* seen by queries >= limit */
#pragma omp simd
                for (int r = 0; r < rows; r++)
                    if (w->query[r] < limit) s[t * rows + r] = -FLT_MAX;
            }
        /* ... and, with a window, what lies before each row's window: a row whose every
         * token of the first step is masked gets a garbage sum there, which the next
         * step's rescale expf(-FLT_MAX - m) = 0 wipes out. */
        if (window > 0 && start < first_pos + nq - window)
            for (int t = 0; t < KT; t++) {
                const int64_t limit = start + t - first_pos + window; /* seen by queries < */
#pragma omp simd
                for (int r = 0; r < rows; r++)
                    if (w->query[r] >= limit) s[t * rows + r] = -FLT_MAX;
            }
        float *restrict max = w->max, *restrict sum = w->sum, *restrict rescale = w->rescale;
#pragma omp simd
        for (int r = 0; r < rows; r++) {
            float m = start > lo ? max[r] : -FLT_MAX;
            for (int t = 0; t < KT; t++) m = fmaxf(m, s[t * rows + r]);
            /* without a window every row sees token 0, so after the first step max is a
             * real score (with one, see the window's mask above) */
            rescale[r] = start > lo ? expf(max[r] - m) : 0.f;
            max[r] = m;
        }
        /* The clamp keeps expf on its fast path (the vector expf hands arguments whose
         * result would underflow to the slow scalar one) and turns the masked scores into
         * e^-80: nothing next to the e^0 of the row's max, which it always sees. */
        for (int t = 0; t < KT; t++) {
            float *restrict p = s + t * rows;
#pragma omp simd
            for (int r = 0; r < rows; r++) p[r] = expf(fmaxf(p[r] - max[r], -80.f));
        }
#pragma omp simd
        for (int r = 0; r < rows; r++) {
            float step_sum = 0.f;
            for (int t = 0; t < KT; t++) step_sum += s[t * rows + r];
            sum[r] = sum[r] * rescale[r] + step_sum;
        }
        if (start > lo)
            for (int d = 0; d < head_dim; d++) {
                float *restrict o = ot + d * rows;
#pragma omp simd
                for (int r = 0; r < rows; r++) o[r] *= rescale[r];
            }
        step_values(s, w->v, ot, rows, head_dim);
    }
    const int64_t out_stride = (int64_t)num_heads * head_dim;
    for (int r = 0; r < used; r++) {
        float *dst = out + (r / group) * out_stride + (g * group + r % group) * head_dim;
        const float inv = 1.f / w->sum[r];
        for (int d = 0; d < head_dim; d++) dst[d] = ot[d * rows + r] * inv;
    }
}

typedef struct {
    int64_t cost; /* rows x context: the item's work */
    int req, tile, kv_head;
} prefill_work;

static int by_cost_descending(const void *a, const void *b) {
    const int64_t x = ((const prefill_work *)a)->cost, y = ((const prefill_work *)b)->cost;
    return (x < y) - (x > y);
}

void paged_prefill_attention_f32(const float *q, const void *k_cache, const void *v_cache,
                                 int kv_bf16, const int64_t *block_table, const int64_t *query_start_loc,
                                 const int64_t *seq_lens, float *out, int num_reqs,
                                 int num_heads, int num_kv_heads, int head_dim, int block_size,
                                 int max_blocks, int64_t q_stride, float scale, int window,
                                 float softcap, int num_threads) {
    const int group = num_heads / num_kv_heads;
    const int tile = group < ROWS ? ROWS / group : 1; /* queries per item */
    int64_t num_items = 0;
    for (int p = 0; p < num_reqs; p++)
        num_items += (query_start_loc[p + 1] - query_start_loc[p] + tile - 1) / tile;
    num_items *= num_kv_heads;
    if (num_items == 0) return;
    /* The costliest items first (the last tiles of the longest contexts): with dynamic
     * scheduling the threads then finish together. */
    prefill_work *items = malloc(num_items * sizeof *items);
    if (items == NULL) abort();
    int64_t at = 0;
    for (int p = 0; p < num_reqs; p++) {
        const int64_t query_len = query_start_loc[p + 1] - query_start_loc[p];
        for (int64_t i = 0; i * tile < query_len; i++) {
            const int64_t nq = query_len - i * tile < tile ? query_len - i * tile : tile;
            const int64_t last_pos = seq_lens[p] - query_len + i * tile + nq - 1;
            const int64_t seen = window > 0 && last_pos + 1 > window + nq ? window + nq
                                                                          : last_pos + 1;
            for (int g = 0; g < num_kv_heads; g++)
                items[at++] = (prefill_work){nq * seen, p, (int)i, g};
        }
    }
    qsort(items, num_items, sizeof *items, by_cost_descending);
    const size_t rows = (tile * group + VL - 1) / VL * VL;
#pragma omp parallel num_threads(num_threads)
    {
        scratch w;
        float *buf = malloc((rows * (2 * head_dim + KT + 3) + head_dim + 2 * KT * head_dim)
                            * sizeof(float));
        w.query = malloc(rows * sizeof(int));
        if (buf == NULL || w.query == NULL) abort();
        w.qt = buf;
        w.ot = w.qt + rows * head_dim;
        w.s = w.ot + rows * head_dim;
        w.max = w.s + rows * KT;
        w.sum = w.max + rows;
        w.rescale = w.sum + rows;
        w.zero = w.rescale + rows;
        for (int d = 0; d < head_dim; d++) w.zero[d] = 0.f;
        w.wide = w.zero + head_dim;
#pragma omp for schedule(dynamic)
        for (int64_t it = 0; it < num_items; it++) {
            const prefill_work item = items[it];
            const int64_t req_start = query_start_loc[item.req];
            const int64_t query_len = query_start_loc[item.req + 1] - req_start;
            const int64_t first = (int64_t)item.tile * tile; /* the item's first query */
            const int nq = (int)(query_len - first < tile ? query_len - first : tile);
            const int64_t first_pos = seq_lens[item.req] - query_len + first;
            const int64_t *table = block_table + (int64_t)item.req * max_blocks;
            const float *qi = q + (req_start + first) * q_stride;
            float *o = out + (req_start + first) * num_heads * head_dim;
            /* No copies per common head_dim, unlike the decode kernel: the register blocks
             * have constant sizes whatever head_dim is, and copies measured no faster. */
            prefill_item(qi, k_cache, v_cache, kv_bf16, table, first_pos, nq, item.kv_head, num_heads,
                         num_kv_heads, head_dim, block_size, q_stride, scale, window, softcap,
                         o, &w);
        }
        free(w.query);
        free(buf);
    }
    free(items);
}
