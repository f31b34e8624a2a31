/* What the three prefill attention kernels (paged_prefill_attention.c on fp32 FMAs,
 * amx_attention.c on AMX-BF16 tiles, dpbf16_attention.c on AVX-512 BF16 pair dots) share:
 * how a step's work is split into items, each one thread's from start to end, and how an
 * item's outputs are written (the bf16 ones also how a step finds its K/V rows). An item is
 * (request, kv head, tile of consecutive queries); its rows are the tile's queries times the
 * group = num_heads / num_kv_heads query heads sharing the kv head, so one pass over the
 * context's K/V serves them all. */
#ifndef MINIVLLM_ATTENTION_PLAN_H
#define MINIVLLM_ATTENTION_PLAN_H

#include <stdint.h>
#include <stdlib.h>

/* Target rows per item (queries x group): each K/V element serves ~64 rows; 128 spill
 * paged_prefill_attention.c's queries and outputs out of L1 (measured on AVX-512, Zen 5). */
#define ITEM_ROWS 64

typedef struct {
    int64_t cost; /* rows x context: the item's work */
    int req, tile, kv_head;
} prefill_work;

/* Queries per item (a tile) for query heads in groups of `group`. */
static inline int queries_per_item(int group) {
    return group < ITEM_ROWS ? ITEM_ROWS / group : 1;
}

static inline int by_cost_descending(const void *a, const void *b) {
    const int64_t x = ((const prefill_work *)a)->cost, y = ((const prefill_work *)b)->cost;
    return (x < y) - (x > y);
}

/* The step's items, the costliest first (the last tiles of the longest contexts): taken
 * with dynamic scheduling, the threads then finish together. Their count goes to
 * *num_items; NULL when there are none, or (*num_items > 0) when memory ran out. With
 * window > 0 an item's queries see at most window + tile positions. */
static inline prefill_work *plan_prefill_work(const int64_t *query_start_loc,
                                              const int64_t *seq_lens, int num_reqs,
                                              int num_kv_heads, int tile, int window,
                                              int64_t *num_items) {
    int64_t n = 0;
    for (int p = 0; p < num_reqs; p++)
        n += (query_start_loc[p + 1] - query_start_loc[p] + tile - 1) / tile;
    n *= num_kv_heads;
    *num_items = n;
    prefill_work *items = n ? malloc(n * sizeof *items) : NULL;
    if (items == NULL) return NULL;
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
    qsort(items, n, sizeof *items, by_cost_descending);
    return items;
}

/* Where an item's queries are: */
typedef struct {
    int64_t token;     /* the first one's row of q and out */
    int64_t first_pos; /* its position in the request's context */
    int nq;            /* how many */
} item_queries;

static inline item_queries locate_item(prefill_work item, const int64_t *query_start_loc,
                                       const int64_t *seq_lens, int tile) {
    const int64_t req_start = query_start_loc[item.req];
    const int64_t query_len = query_start_loc[item.req + 1] - req_start;
    const int64_t first = (int64_t)item.tile * tile; /* the item's first query */
    return (item_queries){req_start + first, seq_lens[item.req] - query_len + first,
                          (int)(query_len - first < tile ? query_len - first : tile)};
}

/* Where an item's row r is in q or out (query rows `stride` floats apart, q and out at the
 * item's first query): query r / group, head g * group + r % group, for kv head g. */
static inline int64_t row_offset(int r, int group, int g, int64_t stride, int head_dim) {
    return (r / group) * stride + (g * group + r % group) * head_dim;
}

/* The item's outputs: each used row r's unnormalized sum (o[r * row_step + d * dim_step]:
 * rows along the lanes or row by row) over its softmax sum, to out (at the item's first
 * query, rows of num_heads * head_dim). */
static inline void write_outputs(float *out, const float *o, int64_t row_step,
                                 int64_t dim_step, const float *sum, int used, int group,
                                 int g, int num_heads, int head_dim) {
    const int64_t out_stride = (int64_t)num_heads * head_dim;
    for (int r = 0; r < used; r++) {
        float *dst = out + row_offset(r, group, g, out_stride, head_dim);
        const float inv = 1.f / sum[r];
        for (int d = 0; d < head_dim; d++) dst[d] = o[r * row_step + d * dim_step] * inv;
    }
}

/* The arguments of the two bf16 kernels (kernels.h), as their items read them. */
typedef struct {
    const float *q;
    const uint16_t *k_cache, *v_cache;
    const int64_t *block_table, *query_start_loc, *seq_lens;
    float *out;
    int num_heads, num_kv_heads, head_dim, block_size, max_blocks;
    int64_t q_stride;
    float scale;
} bf16_prefill_args;

/* One item of a bf16 kernel: queries 0..nq at positions first_pos + i (their rows of q at
 * q, q_stride apart; their outputs at out), kv head g, the request's block table row
 * `table`, in the calling thread's scratch. */
typedef void bf16_attend_item(const bf16_prefill_args *a, const float *q, float *out,
                              const int64_t *table, int64_t first_pos, int nq, int g,
                              void *scratch);

/* Inside a parallel region: the step's items (plan_prefill_work's, tiles of `tile`
 * queries), taken by the threads in turn, each attended in the calling thread's scratch.
 * A thread without scratch (memory ran out) still meets the loop, as OpenMP requires, and
 * skips its items: its kernel then returns -1 and the caller redoes the whole step. */
static inline void attend_bf16_items(const bf16_prefill_args *a, const prefill_work *items,
                                     int64_t num_items, int tile, bf16_attend_item *attend,
                                     void *scratch) {
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < num_items; it++) {
        if (!scratch) continue;
        const prefill_work item = items[it];
        const item_queries at = locate_item(item, a->query_start_loc, a->seq_lens, tile);
        attend(a, a->q + at.token * a->q_stride, a->out + at.token * a->num_heads * a->head_dim,
               a->block_table + (int64_t)item.req * a->max_blocks, at.first_pos, at.nq,
               item.kv_head, scratch);
    }
}

/* A step of the two bf16 kernels: kv head g's K and V rows of the n context positions from
 * `start`, in place in a bf16 cache (through the block table), the zero row for positions
 * at or past len. */
static inline void bf16_step_rows(const uint16_t *k_cache, const uint16_t *v_cache,
                                  const int64_t *table, int64_t start, int64_t len, int n,
                                  int block_size, int num_kv_heads, int head_dim, int g,
                                  const uint16_t *zero, const uint16_t **k,
                                  const uint16_t **v) {
    const int64_t row = (int64_t)num_kv_heads * head_dim, block = block_size * row;
    for (int t = 0; t < n; t++) {
        const int64_t pos = start + t;
        if (pos < len) {
            const int64_t at = table[pos / block_size] * block + pos % block_size * row
                               + g * head_dim;
            k[t] = k_cache + at;
            v[t] = v_cache + at;
        } else {
            k[t] = v[t] = zero;
        }
    }
}

#endif
