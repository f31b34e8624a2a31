/* Prefill attention on AVX-512 BF16 dot products (vdpbf16ps), for a bf16 K/V cache
 * (dtype=bfloat16, or --kv-cache-dtype bfloat16) on a CPU with avx512_bf16 but no AMX tiles
 * (Zen 4 / Zen 5, Cooper Lake): the same attention as paged_prefill_attention.c's
 * paged_prefill_attention_f32 (layouts, positions, causality: see there), with both products
 * as bf16 pair dots, twice the fp32 FMA's rate. At 1,024 tokens SmolLM2's prefill attention
 * took a third of the prompt's time at fp32 FMA speed on a Zen 5.
 *
 * What changes in the numbers is what amx_attention.c changes: the queries (times scale) are
 * rounded to bf16, as the keys already are, and so are the softmax's unnormalized
 * probabilities before they multiply the values; scores, the running max and sum, and the
 * outputs stay fp32. No window and no softcap here (the caller runs
 * paged_prefill_attention.c for those), head_dim a multiple of 16.
 *
 * Work items are the fp32 kernel's (attention_plan.h), and so is the item's shape: its rows
 * (queries x the group of query heads sharing the kv head) along the vector lanes, 16 a
 * vector, so that both products are a vector of rows times a broadcast operand, in register
 * blocks of accumulators. vdpbf16ps multiplies pairs: the queries are kept as pairs of dims
 * ([head_dim / 2][rows], each a 32-bit pair of bf16) against a K row's pair of dims, which
 * the cache holds side by side (broadcast in place, no packing); the probabilities as pairs
 * of tokens ([KT / 2][rows]) against the same pair of tokens' values of one dim, which a
 * step interleaves once for all the item's rows. The online softmax (running max and sum per
 * row) is elementwise vector work, 16 rows at a time. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include "attention_plan.h"
#include "vector_exp.h"

#define VL 16 /* rows per vector */
#define KT 32 /* context tokens per step */
#define NR 2  /* row vectors per register block of both products */
#define TB 8  /* tokens per register block of the score product */
#define DB 8  /* head dims per register block of the value product */
_Static_assert(KT % TB == 0, "a step is a whole number of score blocks");

typedef struct {
    uint32_t *q;      /* [head_dim / 2][rows] the item's queries times scale, pairs of dims */
    float *o;         /* [head_dim][rows] unnormalized outputs */
    float *s;         /* [KT][rows] a step's scores */
    uint32_t *p;      /* [KT / 2][rows] a step's probabilities, pairs of tokens */
    uint32_t *v;      /* [KT / 2][head_dim] a step's values, pairs of tokens of each dim */
    float *max, *sum; /* [rows] the online softmax's running max and sum */
    float *rescale;   /* [rows] a step's correction of the running sum and outputs */
    int32_t *query;   /* [rows] the row's query within the item */
    uint16_t *zero;   /* [head_dim] the K and V row of a token past the context */
} scratch;

static inline __m512bh pair_of(const uint16_t *p) { /* two bf16 side by side, broadcast */
    uint32_t x;
    memcpy(&x, p, sizeof x);
    return (__m512bh)_mm512_set1_epi32((int)x);
}

static inline __m512bh load_pairs(const uint32_t *p) {
    return (__m512bh)_mm512_loadu_si512(p);
}

/* s[t][r] = sum_d q[r][d] k[t][d] for the step's KT tokens, rows r..r + nr * VL: nr x TB
 * accumulators, each pair of K elements broadcast once for nr row vectors. */
static inline __attribute__((always_inline)) void scores_block(
    const uint32_t *restrict q, const uint16_t *const *restrict k, float *restrict s,
    int rows, int head_dim, int r, int nr) {
    for (int t = 0; t < KT; t += TB) {
        __m512 a[NR][TB];
#pragma GCC unroll 16
        for (int b = 0; b < TB; b++)
#pragma GCC unroll 8
            for (int i = 0; i < nr; i++) a[i][b] = _mm512_setzero_ps();
        for (int d = 0; d < head_dim / 2; d++) {
            __m512bh x[NR];
#pragma GCC unroll 8
            for (int i = 0; i < nr; i++) x[i] = load_pairs(q + d * rows + r + i * VL);
#pragma GCC unroll 16
            for (int b = 0; b < TB; b++) {
                const __m512bh kb = pair_of(k[t + b] + 2 * d);
#pragma GCC unroll 8
                for (int i = 0; i < nr; i++) a[i][b] = _mm512_dpbf16_ps(a[i][b], x[i], kb);
            }
        }
#pragma GCC unroll 16
        for (int b = 0; b < TB; b++)
#pragma GCC unroll 8
            for (int i = 0; i < nr; i++) _mm512_storeu_ps(s + (t + b) * rows + r + i * VL, a[i][b]);
    }
}

/* o[d][r] = o[d][r] * rescale[r] + sum_t p[r][t] v[t][d] for the step's KT tokens, dims
 * d..d + DB and rows r..r + nr * VL: nr x DB accumulators. */
static inline __attribute__((always_inline)) void values_block(const scratch *w, int rows,
                                                              int head_dim, int r, int nr,
                                                              int d) {
    __m512 a[NR][DB], scale[NR];
#pragma GCC unroll 8
    for (int i = 0; i < nr; i++) scale[i] = _mm512_loadu_ps(w->rescale + r + i * VL);
#pragma GCC unroll 16
    for (int b = 0; b < DB; b++)
#pragma GCC unroll 8
        for (int i = 0; i < nr; i++)
            a[i][b] = _mm512_mul_ps(_mm512_loadu_ps(w->o + (d + b) * rows + r + i * VL), scale[i]);
    for (int j = 0; j < KT / 2; j++) {
        __m512bh x[NR];
#pragma GCC unroll 8
        for (int i = 0; i < nr; i++) x[i] = load_pairs(w->p + j * rows + r + i * VL);
#pragma GCC unroll 16
        for (int b = 0; b < DB; b++) {
            const __m512bh vb = (__m512bh)_mm512_set1_epi32((int)w->v[j * head_dim + d + b]);
#pragma GCC unroll 8
            for (int i = 0; i < nr; i++) a[i][b] = _mm512_dpbf16_ps(a[i][b], x[i], vb);
        }
    }
#pragma GCC unroll 16
    for (int b = 0; b < DB; b++)
#pragma GCC unroll 8
        for (int i = 0; i < nr; i++) _mm512_storeu_ps(w->o + (d + b) * rows + r + i * VL, a[i][b]);
}

/* The step's KT V rows as pairs of tokens: v[j][d] holds tokens 2j and 2j + 1 of dim d. */
static void pack_values(const uint16_t *const v[KT], int head_dim, uint32_t *vt) {
    static const uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15,
                                       31};
    const __m512i interleave = _mm512_loadu_si512(order);
    for (int j = 0; j < KT / 2; j++)
        for (int d = 0; d < head_dim; d += 16) {
            const __m256i even = _mm256_loadu_si256((const __m256i *)(v[2 * j] + d));
            const __m256i odd = _mm256_loadu_si256((const __m256i *)(v[2 * j + 1] + d));
            const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(even), odd, 1);
            _mm512_storeu_si512(vt + j * head_dim + d, _mm512_permutexvar_epi16(interleave, both));
        }
}

/* Row r sees token start + t iff start + t <= first_pos + query[r] (paged_prefill_attention.c);
 * tokens past the context are past every row's limit. Only steps reaching past the item's
 * first query position mask anything. */
static void mask_step(const scratch *w, int rows, int64_t start, int64_t first_pos) {
    if (start + KT - 1 <= first_pos) return;
    const __m512 hidden = _mm512_set1_ps(-FLT_MAX);
    for (int t = 0; t < KT; t++) {
        const __m512i limit = _mm512_set1_epi32((int)(start + t - first_pos));
        for (int r = 0; r < rows; r += VL) {
            const __mmask16 unseen =
                _mm512_cmplt_epi32_mask(_mm512_loadu_si512(w->query + r), limit);
            float *s = w->s + t * rows + r;
            _mm512_storeu_ps(s, _mm512_mask_mov_ps(_mm512_loadu_ps(s), unseen, hidden));
        }
    }
}

/* The online softmax of the step, 16 rows at once: each row's new max, the rescale of its
 * running sum and outputs (e^(old max - new max): e^-80 on the first step, where the old max
 * is -FLT_MAX and the sum and outputs 0), its probabilities e^(s - max) as bf16 pairs of
 * tokens, and their sum. Every row sees token 0, so after the first step max is a real score. */
static void softmax_step(const scratch *w, int rows) {
    for (int r = 0; r < rows; r += VL) {
        const __m512 old = _mm512_loadu_ps(w->max + r);
        __m512 m = old;
        for (int t = 0; t < KT; t++) m = _mm512_max_ps(m, _mm512_loadu_ps(w->s + t * rows + r));
        const __m512 rescale = exp_nonpositive(_mm512_sub_ps(old, m));
        __m512 step_sum = _mm512_setzero_ps();
        for (int j = 0; j < KT / 2; j++) {
            const __m512 even = exp_nonpositive(
                _mm512_sub_ps(_mm512_loadu_ps(w->s + 2 * j * rows + r), m));
            const __m512 odd = exp_nonpositive(
                _mm512_sub_ps(_mm512_loadu_ps(w->s + (2 * j + 1) * rows + r), m));
            step_sum = _mm512_add_ps(step_sum, _mm512_add_ps(even, odd));
            const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(even));
            const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(odd));
            _mm512_storeu_si512(w->p + j * rows + r,
                                _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
        _mm512_storeu_ps(w->max + r, m);
        _mm512_storeu_ps(w->rescale + r, rescale);
        _mm512_storeu_ps(w->sum + r,
                         _mm512_fmadd_ps(_mm512_loadu_ps(w->sum + r), rescale, step_sum));
    }
}

/* One item: queries 0..nq at positions first_pos + i, kv head g (paged_prefill_attention.c's
 * prefill_item, without window and softcap). */
static void attend_item(const bf16_prefill_args *a, const float *q, float *out,
                        const int64_t *table, int64_t first_pos, int nq, int g, void *scratch_) {
    scratch *w = scratch_;
    const int num_heads = a->num_heads, num_kv_heads = a->num_kv_heads, head_dim = a->head_dim;
    const int block_size = a->block_size;
    const int64_t q_stride = a->q_stride;
    const float scale = a->scale;
    const uint16_t *k_cache = a->k_cache, *v_cache = a->v_cache;
    const int group = num_heads / num_kv_heads, used = nq * group;
    const int rows = (used + VL - 1) / VL * VL;
    const int64_t len = first_pos + nq; /* the context the last query sees */
    for (int r = 0; r < rows; r++) {
        const float *src = q + row_offset(r, group, g, q_stride, head_dim);
        for (int d = 0; d < head_dim; d += 16) {
            const __m512 x = r < used ? _mm512_mul_ps(_mm512_loadu_ps(src + d),
                                                      _mm512_set1_ps(scale))
                                      : _mm512_setzero_ps(); /* padding: output dropped */
            uint32_t pairs[8];
            _mm256_storeu_si256((__m256i *)pairs, (__m256i)_mm512_cvtneps_pbh(x));
            for (int i = 0; i < 8; i++) w->q[(d / 2 + i) * rows + r] = pairs[i];
        }
        w->sum[r] = 0.f;
        w->max[r] = -FLT_MAX;
        w->query[r] = r < used ? r / group : nq - 1;
    }
    memset(w->o, 0, (size_t)head_dim * rows * sizeof(float));
    for (int64_t start = 0; start < len; start += KT) {
        const uint16_t *k[KT], *v[KT];
        bf16_step_rows(k_cache, v_cache, table, start, len, KT, block_size, num_kv_heads,
                       head_dim, g, w->zero, k, v);
        pack_values(v, head_dim, w->v);
        int r = 0;
        for (; r + NR * VL <= rows; r += NR * VL) scores_block(w->q, k, w->s, rows, head_dim, r, NR);
        for (; r < rows; r += VL) scores_block(w->q, k, w->s, rows, head_dim, r, 1);
        mask_step(w, rows, start, first_pos);
        softmax_step(w, rows);
        for (r = 0; r + NR * VL <= rows; r += NR * VL)
            for (int d = 0; d < head_dim; d += DB) values_block(w, rows, head_dim, r, NR, d);
        for (; r < rows; r += VL)
            for (int d = 0; d < head_dim; d += DB) values_block(w, rows, head_dim, r, 1, d);
    }
    write_outputs(out, w->o, 1, rows, w->sum, used, group, g, num_heads, head_dim);
}
#endif

int paged_prefill_attention_dpbf16(const float *q, const uint16_t *k_cache,
                                   const uint16_t *v_cache, const int64_t *block_table,
                                   const int64_t *query_start_loc, const int64_t *seq_lens,
                                   float *out, int num_reqs, int num_heads, int num_kv_heads,
                                   int head_dim, int block_size, int max_blocks,
                                   int64_t q_stride, float scale, int num_threads) {
#if defined(__AVX512BF16__)
    if (head_dim % 16) return -1;
    const int group = num_heads / num_kv_heads;
    const int tile = queries_per_item(group);
    const bf16_prefill_args args = {q, k_cache, v_cache, block_table, query_start_loc,
                                    seq_lens, out, num_heads, num_kv_heads, head_dim,
                                    block_size, max_blocks, q_stride, scale};
    int64_t num_items;
    prefill_work *items = plan_prefill_work(query_start_loc, seq_lens, num_reqs, num_kv_heads,
                                            tile, 0, &num_items);
    if (num_items == 0) return 0;
    if (items == NULL) return -1;
    const size_t rows = (tile * group + VL - 1) / VL * VL;
    /* the scratch's arrays of 4-byte values, then the zero row */
    const size_t words = rows * (head_dim / 2 + head_dim + KT + KT / 2 + 4) + KT / 2 * head_dim;
    int failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
        scratch w;
        char *buf = aligned_alloc(64, (words * 4 + head_dim * 2) / 64 * 64 + 64);
        if (buf) {
            w.q = (uint32_t *)buf;
            w.o = (float *)(w.q + rows * head_dim / 2);
            w.s = w.o + rows * head_dim;
            w.p = (uint32_t *)(w.s + rows * KT);
            w.v = w.p + rows * KT / 2;
            w.max = (float *)(w.v + KT / 2 * head_dim);
            w.sum = w.max + rows;
            w.rescale = w.sum + rows;
            w.query = (int32_t *)(w.rescale + rows);
            w.zero = (uint16_t *)(w.query + rows);
            memset(w.zero, 0, head_dim * 2);
        } else {
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        }
        attend_bf16_items(&args, items, num_items, tile, attend_item, buf ? &w : NULL);
        free(buf);
    }
    free(items);
    return failed ? -1 : 0;
#else
    (void)q, (void)k_cache, (void)v_cache, (void)block_table, (void)query_start_loc;
    (void)seq_lens, (void)out, (void)num_reqs, (void)num_heads, (void)num_kv_heads;
    (void)head_dim, (void)block_size, (void)max_blocks, (void)q_stride, (void)scale;
    (void)num_threads;
    return -1;
#endif
}
