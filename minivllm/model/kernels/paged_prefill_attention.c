/* Paged attention for prefill steps (several new tokens per request: a prompt, or a chunk
 * of one on top of tokens already cached), causal by position, fp32 math, CPU; a bf16
 * K/V cache is widened, an int8 or fp8 one dequantized with its scales, a step (KT rows)
 * at a time into a small buffer (kv_rows.h).
 *
 * Request p has query_len = query_start_loc[p + 1] - query_start_loc[p] new tokens, the
 * last ones of its seq_lens[p] positions: its query i sits at position
 * seq_lens[p] - query_len + i and attends to positions 0..that one, or to the last `window`
 * of them when window > 0 (the item's walk then starts at its first query's window, and
 * each row masks what lies before its own); softcap as in paged_decode_attention.c.
 *
 * Work is split into items (request, kv head, tile of consecutive queries: attention_plan.h,
 * shared with amx_attention.c). An item's rows are its queries times the group =
 * num_heads / num_kv_heads query heads that share the kv head, so one pass over the
 * context's K/V serves them all: each K/V row is read once per item, not once per query and
 * head. The context is walked KT tokens at a time through
 * the block table (a step may span blocks of any size), K and V read in place.
 *
 * The item keeps its rows along the vector lanes: queries, scores and outputs are stored
 * transposed ([head_dim][rows], [KT][rows]), so that both products are vectors of rows
 * times a broadcast K or V element, with register-blocked accumulators, and the online
 * softmax (running max and sum per row, as in the decode kernel) is elementwise
 * vector work, 16 rows at a time with AVX-512, not a scalar loop per row. Causality costs a
 * mask only on the steps that reach past the item's first query position. No dense mask
 * and no copy of the context are made. Each item is one thread's work from start to end,
 * so the result does not depend on the number of threads.
 *
 * Layouts (contiguous, except q's rows, q_stride floats apart):
 *   q, out           [num_tokens, num_heads, head_dim]
 *   k/v_cache        [num_blocks, block_size, num_kv_heads, head_dim]
 *   k/v_scales       [num_blocks, block_size, num_kv_heads]   (int8 / fp8 caches)
 *   block_table      [num_reqs, max_blocks]   (int64)
 *   query_start_loc  [num_reqs + 1]           (int64, from 0)
 *   seq_lens         [num_reqs]               (int64)
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_plan.h"
#include "kernels.h"
#include "kv_rows.h"

/* Sizes, measured on AVX-512 (Zen 5): a register block of NR x TB (or NR x DB) vector
 * accumulators beats NR = 1 by ~15%, as each broadcast K or V element then feeds NR FMAs
 * (ITEM_ROWS, attention_plan.h, is measured there too). A vector is one
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
    float *wide;    /* [2][KT][head_dim] a step's K and V rows converted to fp32 */
    const float *k[KT], *v[KT]; /* a step's key and value rows */
} scratch;

/* One item: queries 0..nq at positions first_pos + i, kv head g. q points at query 0, head 0;
 * out likewise (row_offset: where its rows are). */
static void prefill_item(
    const float *q, kv_cache k_cache, kv_cache v_cache, const int64_t *table,
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
            const float *src = q + row_offset(r, group, g, q_stride, head_dim);
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
                w->k[t] = kv_rows(k_cache, at, head_dim, head_dim, wide);
                w->v[t] = kv_rows(v_cache, at, head_dim, head_dim, wide + KT * head_dim);
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
    write_outputs(out, ot, 1, rows, w->sum, used, group, g, num_heads, head_dim);
}

void paged_prefill_attention_f32(const float *q, const void *k_cache, const void *v_cache,
                                 const float *k_scales, const float *v_scales, int kv_type,
                                 const float *fp8_values, const int64_t *block_table,
                                 const int64_t *query_start_loc,
                                 const int64_t *seq_lens, float *out, int num_reqs,
                                 int num_heads, int num_kv_heads, int head_dim, int block_size,
                                 int max_blocks, int64_t q_stride, float scale, int window,
                                 float softcap, int num_threads) {
    const int group = num_heads / num_kv_heads;
    const int tile = queries_per_item(group);
    int64_t num_items;
    prefill_work *items = plan_prefill_work(query_start_loc, seq_lens, num_reqs, num_kv_heads,
                                            tile, window, &num_items);
    if (num_items == 0) return;
    if (items == NULL) abort();
    const size_t rows = (tile * group + VL - 1) / VL * VL;
    const kv_cache k = {k_cache, k_scales, fp8_values, kv_type};
    const kv_cache v = {v_cache, v_scales, fp8_values, kv_type};
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
            const item_queries at = locate_item(item, query_start_loc, seq_lens, tile);
            /* No copies per common head_dim, unlike the decode kernel: the register blocks
             * have constant sizes whatever head_dim is, and copies measured no faster. */
            prefill_item(q + at.token * q_stride, k, v,
                         block_table + (int64_t)item.req * max_blocks, at.first_pos, at.nq,
                         item.kv_head, num_heads, num_kv_heads, head_dim, block_size, q_stride,
                         scale, window, softcap, out + at.token * num_heads * head_dim, &w);
        }
        free(w.query);
        free(buf);
    }
    free(items);
}
