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
 *   k/v_scales   [num_blocks, block_size, num_kv_heads]   (int8 / fp8 caches)
 *   block_table  [num_seqs, max_blocks]   (int64)
 *   seq_lens     [num_seqs]               (int64)
 *
 * window > 0 (sliding-window layers: Gemma 2/3, Mistral) attends to the last `window`
 * positions only: the blocks before them are never read. softcap > 0 (Gemma 2) squashes
 * each score to softcap * tanh(score / softcap) before the softmax.
 *
 * The K/V cache is fp32, or bf16 (--kv-cache-dtype bfloat16): half the bytes to read,
 * which is what decode attention at long contexts waits on; or int8 / fp8 with a scale per
 * token and KV head (--kv-cache-dtype int8 / fp8: a quarter). A bf16 block is widened to
 * fp32 in a small per-task buffer as it is read (a shift per element: no bf16 arithmetic
 * is needed, and the CPU need not have any), a quantized one dequantized there (kv_rows.h),
 * and the math stays fp32. The AVX-512 kernel converts in registers instead, and applies a
 * quantized cache's scales to the scores (q . (s k) = s (q . k)) and to the probabilities
 * (sum p s v): a multiply per position and head, not per element.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"
#include "kv_rows.h"

static inline void prefetch(const void *p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch((const char *)p + i);
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
    const float *q, kv_cache k_cache, kv_cache v_cache, const int64_t *table,
    int64_t len, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
    int window, float softcap, float *out, float *k_buf, float *v_buf) {
    const int group = num_heads / num_kv_heads;
    const int64_t row = (int64_t)num_kv_heads * head_dim, block = block_size * row;
    const int64_t row_bytes = row * kv_value_bytes(k_cache.type);
    const int64_t block_bytes = block_size * row_bytes;
    float max[num_heads], sum[num_heads], scores[num_heads][block_size];
    zero_heads(out, sum, num_heads, head_dim);
    const int64_t first = window > 0 && len > window ? len - window : 0;
    for (int64_t start = first, n; start < len; start += n) {
        n = run_length(start, len, block_size);
        const int64_t at = table[start / block_size] * block + start % block_size * row;
        const float *k = kv_rows(k_cache, at, n * row, head_dim, k_buf);
        const float *v = kv_rows(v_cache, at, n * row, head_dim, v_buf);
        const int64_t next = start + n < len ? table[start / block_size + 1] : -1;
        /* the next block's K and V lines, a share per head, while this block is used */
        const int64_t share = (block_bytes / num_heads + 63) / 64 * 64;
        for (int h = 0; h < num_heads; h++) {
            if (next >= 0 && h * share < block_bytes)
                prefetch((const char *)k_cache.data + next * block_bytes + h * share,
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
                prefetch((const char *)v_cache.data + next * block_bytes + h * share,
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
 * above on SmolLM's shape (9 heads sharing 3 K/V heads), it differs in four ways:
 *  - a bf16 cache is widened in registers as it is loaded (a zero-extend and a shift),
 *    not in a buffer pass first; an int8 one converted there (an fp8 one looked up: a
 *    gather from its 256 values), its scales applied to scores and probabilities;
 *  - the query heads sharing a K/V head are scored together, up to GB at a time: each K
 *    and V vector is loaded (and widened) once for all of them, not once per head;
 *  - 16 lanes per vector;
 *  - one online-softmax step per CHUNK positions, not per block (see attend_wide).
 * Over 30 layers' caches (out of L3), 64 sequences x 192 positions, bf16 cache, Zen 5, 2
 * threads: 0.41 ms a layer (23 GB/s, against a 35 GB/s copy), where it took 0.80 before it
 * read a block's K/V heads together and asked for the lines ahead (prefetch_share); the
 * AVX2 kernel 0.45. In cache it is 2x the AVX2 one. */
#define GB 3     /* heads scored together: GB x 8 accumulators of the 32 registers */
#define CHUNK 64 /* positions per online-softmax step */
#define AHEAD 32 /* positions between the run read and the run asked for (prefetch_share) */

/* 16 elements of a K/V cache from element `at`, as fp32 (a quantized cache's unscaled) */
static inline __attribute__((always_inline)) __m512 kv16(kv_cache c, int64_t at) {
    if (c.type == KV_F32) return _mm512_loadu_ps((const float *)c.data + at);
    if (c.type == KV_BF16) {
        const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)c.data + at));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    }
    const __m128i bytes = _mm_loadu_si128((const __m128i *)((const uint8_t *)c.data + at));
    if (c.type == KV_INT8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
    return _mm512_i32gather_ps(_mm512_cvtepu8_epi32(bytes), c.fp8, 4);
}

/* scores[j][0..8) = q_j . k_t for the nh (<= GB) heads j from q and the 8 key rows t from
 * element `at` (`row` apart): GB x 8 accumulators, each K vector loaded once for all. */
static inline __attribute__((always_inline)) void scores8_wide(
    const float *q, int nh, kv_cache k_cache, int64_t at, int64_t row,
    int head_dim, float *scores, int scores_stride) {
    __m512 acc[GB][8];
    for (int j = 0; j < GB; j++)
        for (int t = 0; t < 8; t++) acc[j][t] = _mm512_setzero_ps();
    for (int d = 0; d < head_dim; d += 16)
        for (int t = 0; t < 8; t++) {
            const __m512 k = kv16(k_cache, at + t * row + d);
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
    float *out, int nh, const float *p, int p_stride, kv_cache v_cache,
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
                v[i] = kv16(v_cache, at + t * row + d0 + 16 * i);
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

/* Share `part` of `parts` of one cache's lines for positions [from, min(to, len)), into
 * L2. The wide kernel asks for the run of positions AHEAD on from the one it reads, a share
 * per K/V head, so the requests are spread over the work: a sequence's blocks lie anywhere
 * in the pool, and the hardware prefetcher, which learns one stream at a time, left a bf16
 * cache read at a third of the memory's bandwidth (a whole chunk asked for at once, in one
 * burst, did little). */
static inline __attribute__((always_inline)) void prefetch_share(
    kv_cache c, const int64_t *table, int64_t from, int64_t to, int64_t len, int block_size,
    int64_t row_bytes, int part, int parts) {
    if (to > len) to = len;
    for (int64_t pos = from, n; pos < to; pos += n) {
        n = run_length(pos, to, block_size);
        const char *run = (const char *)c.data
                          + (table[pos / block_size] * block_size + pos % block_size) * row_bytes;
        const int64_t bytes = n * row_bytes, share = (bytes / parts + 63) / 64 * 64;
        for (int64_t b = part * share; b < bytes && b < (part + 1) * share; b += 64)
            _mm_prefetch(run + b, _MM_HINT_T1);
    }
}

/* attend() with the wide kernels: CHUNK positions per online-softmax step (a chunk spans
 * blocks: with 16-position blocks, a step per block spent as long on the softmax
 * bookkeeping as on the dot products). Within a chunk, a block's run of positions at a
 * time, all its K/V heads (each query head group GB at a time) before the next run, so
 * its rows are read once and whole; the run AHEAD positions on is asked for meanwhile. */
static inline __attribute__((always_inline)) void attend_wide(
    const float *q, kv_cache k_cache, kv_cache v_cache, const int64_t *table,
    int64_t len, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
    int window, float softcap, float *out) {
    const int group = num_heads / num_kv_heads;
    const int64_t row = (int64_t)num_kv_heads * head_dim, block = block_size * row;
    float max[num_heads], sum[num_heads], scores[num_heads][CHUNK];
    zero_heads(out, sum, num_heads, head_dim);
    const int64_t first = window > 0 && len > window ? len - window : 0;
    const int64_t row_bytes = row * kv_value_bytes(k_cache.type);
    for (int64_t start = first, span; start < len; start += span) {
        span = len - start < CHUNK ? len - start : CHUNK;
        const int64_t end = start + span;
        /* the chunk's scores, a block's run of positions at a time, every K/V head of it
         * before the next run: its K rows are read once, whole */
        for (int64_t pos = start, n; pos < end; pos += n) {
            n = run_length(pos, end, block_size);
            const int64_t base = table[pos / block_size] * block + pos % block_size * row;
            for (int g = 0; g < num_kv_heads; g++)
                for (int h = g * group; h < (g + 1) * group; h += GB) {
                    const int nh = (g + 1) * group - h < GB ? (g + 1) * group - h : GB;
                    const float *qh = q + h * head_dim;
                    const int64_t at = base + g * head_dim;
                    if (h == g * group) /* the K/V head's share of the run ahead */
                        prefetch_share(k_cache, table, pos + AHEAD, pos + AHEAD + n, len,
                                       block_size, row_bytes, g, num_kv_heads);
                    float *s = &scores[h][pos - start];
                    int t = 0;
#define SCORES8(NH) \
    scores8_wide(qh, NH, k_cache, at + t * row, row, head_dim, s + t, CHUNK)
                    for (; t + 8 <= n; t += 8) WITH_HEADS(nh, SCORES8);
                    for (; t < n; t++)
                        for (int j = 0; j < nh; j++) {
                            __m512 acc = _mm512_setzero_ps();
                            for (int d = 0; d < head_dim; d += 16)
                                acc = _mm512_fmadd_ps(kv16(k_cache, at + t * row + d),
                                                      _mm512_loadu_ps(qh + j * head_dim + d),
                                                      acc);
                            s[j * CHUNK + t] = _mm512_reduce_add_ps(acc);
                        }
                    if (kv_quantized(k_cache.type)) /* each position's K scale */
                        for (t = 0; t < n; t++)
                            for (int j = 0; j < nh; j++)
                                s[j * CHUNK + t] *= k_cache.scales[at / head_dim
                                                                   + t * num_kv_heads];
                }
        }
        for (int h = 0; h < num_heads; h++)
            softmax_run(scores[h], span, scale, softcap, start == first, &max[h], &sum[h],
                        out + h * head_dim, head_dim);
        /* and its values, in the same order */
        for (int64_t pos = start, n; pos < end; pos += n) {
            n = run_length(pos, end, block_size);
            const int64_t base = table[pos / block_size] * block + pos % block_size * row;
            for (int g = 0; g < num_kv_heads; g++)
                for (int h = g * group; h < (g + 1) * group; h += GB) {
                    const int nh = (g + 1) * group - h < GB ? (g + 1) * group - h : GB;
                    const int64_t at = base + g * head_dim;
                    if (h == g * group) /* the K/V head's share of the run ahead */
                        prefetch_share(v_cache, table, pos + AHEAD, pos + AHEAD + n, len,
                                       block_size, row_bytes, g, num_kv_heads);
                    if (kv_quantized(v_cache.type)) /* each position's V scale, in p */
                        for (int j = 0; j < nh; j++)
                            for (int t = 0; t < n; t++)
                                scores[h + j][pos - start + t] *=
                                    v_cache.scales[at / head_dim + t * num_kv_heads];
#define VALUES(NH)                                                                       \
    values_wide(out + h * head_dim, NH, &scores[h][pos - start], CHUNK, v_cache, at, row, n, \
                head_dim)
                    WITH_HEADS(nh, VALUES);
                }
        }
    }
    normalize_heads(out, sum, num_heads, head_dim);
}
#endif

void paged_decode_attention_f32(const float *q, const void *k_cache, const void *v_cache,
                                const float *k_scales, const float *v_scales, int kv_type,
                                const float *fp8_values, const int64_t *block_table,
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
    /* a block's K and V converted to fp32, per thread (none with an fp32 cache, nor for
     * the wide kernel, which converts in registers) */
    const size_t buf_len = kv_type != KV_F32 && !wide
                               ? (size_t)block_size * num_kv_heads * head_dim : 0;
    const kv_cache k = {k_cache, k_scales, fp8_values, kv_type};
    const kv_cache v = {v_cache, v_scales, fp8_values, kv_type};
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
        /* the cache's type as a constant too: a copy per (head_dim, type), the fp8 types
         * sharing one (their gather dominates) */
#define ATTEND_WIDE(D, TYPE)                                                                \
    attend_wide(qs, (kv_cache){k_cache, k_scales, fp8_values, TYPE},                        \
                (kv_cache){v_cache, v_scales, fp8_values, TYPE}, table, seq_lens[s],        \
                num_heads, num_kv_heads, D, block_size, scale, window, softcap, o)
#define ATTEND_WIDE_TYPES(D)                                  \
    switch (kv_type) {                                        \
    case KV_F32: ATTEND_WIDE(D, KV_F32); break;               \
    case KV_BF16: ATTEND_WIDE(D, KV_BF16); break;             \
    case KV_INT8: ATTEND_WIDE(D, KV_INT8); break;             \
    default: ATTEND_WIDE(D, kv_type);                         \
    }
        if (wide) {
            if (head_dim == 64) ATTEND_WIDE_TYPES(64)
            else if (head_dim == 128) ATTEND_WIDE_TYPES(128)
            else ATTEND_WIDE(head_dim, kv_type);
            continue;
        }
#endif
#define ATTEND(D) attend(qs, k, v, table, seq_lens[s], num_heads, num_kv_heads, D, \
                         block_size, scale, window, softcap, o, k_buf, v_buf)
        switch (head_dim) {
        case 64: ATTEND(64); break;
        case 128: ATTEND(128); break;
        default: ATTEND(head_dim);
        }
    }
    free(k_buf);
    }
}
