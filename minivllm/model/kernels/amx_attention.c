/* Prefill attention on AMX-BF16 tiles, for a bf16 K/V cache (dtype=bfloat16, or
 * --kv-cache-dtype bfloat16, on a CPU with AMX): the same attention as
 * paged_prefill_attention.c's paged_prefill_attention_f32 (layouts, positions, causality: see
 * there), with both products on the tiles instead of fp32 FMAs. A long prompt's attention
 * grows with the square of its length (at 4,096 tokens SmolLM2's is 40% of its prefill's
 * FLOPs and was 70% of its time at fp32 FMA speed).
 *
 * What changes in the numbers: the queries (times scale) are rounded to bf16, as the keys
 * already are, and so are the softmax's unnormalized probabilities before they multiply
 * the values; scores, the running max and sum, and the outputs stay fp32. No window and no
 * softcap here (the caller runs paged_prefill_attention.c for those), head_dim a multiple
 * of 32 up to 256.
 *
 * Work items are the fp32 kernel's (attention_plan.h): (request, kv head, tile of queries),
 * rows = the tile's queries x the group of query heads sharing the kv head, up to 64, in row
 * blocks of 16 (a tile's rows). The context is walked 32 tokens a step: the step's K rows are
 * transposed into B tiles (pairs of dims x 16 tokens) and its V rows interleaved into B
 * tiles (pairs of tokens x 16 dims) once, for every row block of the item. Per row block
 * and step: S (16 rows x 32 tokens, two C tiles) = Q . K^T over head_dim / 32 A tiles;
 * the causal mask and the online softmax (running max and sum per row) in AVX-512; P (16
 * x 32 bf16, one A tile) . V into up to 4 C tiles of 16 dims at a time, added to the
 * rescaled outputs. Tiles: 0, 1 the scores, 2 the A operand (Q, then P), 3 the B operand,
 * 4-7 the P . V products. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include "amx_tiles.h"
#include "attention_plan.h"
#include "vector_exp.h"

#define TK 32 /* context tokens per step */
#define MAX_DIM 256

typedef struct {
    uint16_t *q;      /* [rows][head_dim] bf16: the item's queries times scale */
    float *o;         /* [rows][head_dim] unnormalized outputs */
    float *max, *sum; /* [rows] the online softmax's running max and sum */
    int *query;       /* [rows] the row's query within the item */
    uint16_t *kt;     /* [2 halves][head_dim / 32][16 pairs of dims][16 tokens x 2] */
    uint16_t *vt;     /* [head_dim / 16][16 pairs of tokens][16 dims x 2] */
    uint16_t *zero;   /* [MAX_DIM] the K and V row of a token past the context */
} scratch;

/* The step's 32 K rows as B tiles: half h (tokens 16h..16h+15), dims 32c..32c+31: row i
 * holds dims 32c + 2i, 32c + 2i + 1 of the 16 tokens. */
static void pack_keys(const uint16_t *const k[TK], int head_dim, uint16_t *kt) {
    const int chunks = head_dim / 32;
    for (int h = 0; h < 2; h++)
        for (int c = 0; c < chunks; c++) {
            __m512i r[16];
            for (int t = 0; t < 16; t++) r[t] = _mm512_loadu_si512(k[16 * h + t] + 32 * c);
            transpose_16x16(r);
            uint16_t *tile = kt + (int64_t)(h * chunks + c) * 512;
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(tile + 32 * i, r[i]);
        }
}

/* The step's 32 V rows as B tiles: dims 16e..16e+15: row i holds tokens 2i and 2i + 1 of
 * each of the 16 dims, interleaved. */
static void pack_values(const uint16_t *const v[TK], int head_dim, uint16_t *vt) {
    static const uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15,
                                       31};
    const __m512i interleave = _mm512_loadu_si512(order);
    for (int e = 0; e < head_dim / 16; e++)
        for (int i = 0; i < 16; i++) {
            const __m256i even = _mm256_loadu_si256((const __m256i *)(v[2 * i] + 16 * e));
            const __m256i odd = _mm256_loadu_si256((const __m256i *)(v[2 * i + 1] + 16 * e));
            const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(even), odd, 1);
            _mm512_storeu_si512(vt + (int64_t)(e * 16 + i) * 32,
                                _mm512_permutexvar_epi16(interleave, both));
        }
}

/* One row block's step: rows rb..rb+15 of the item against the step's packed K and V. */
static void row_block_step(scratch *w, int rb, int head_dim, int64_t start, int64_t first_pos) {
    const int chunks = head_dim / 32;
    float s[16][TK];
    _tile_zero(0);
    _tile_zero(1);
    for (int c = 0; c < chunks; c++) {
        _tile_loadd(2, w->q + (int64_t)rb * head_dim + 32 * c, head_dim * 2);
        _tile_loadd(3, w->kt + (int64_t)c * 512, 64);
        _tile_dpbf16ps(0, 2, 3);
        _tile_loadd(3, w->kt + (int64_t)(chunks + c) * 512, 64);
        _tile_dpbf16ps(1, 2, 3);
    }
    _tile_stored(0, &s[0][0], sizeof s[0]);
    _tile_stored(1, &s[0][16], sizeof s[0]);
    /* Row r sees token start + t iff start + t <= first_pos + query[r]
     * (paged_prefill_attention.c); tokens past the context are past every row's limit. */
    if (start + TK - 1 > first_pos)
        for (int r = 0; r < 16; r++) {
            const int64_t seen = first_pos + w->query[rb + r] - start; /* last t it sees */
            for (int t = seen + 1 > 0 ? (int)seen + 1 : 0; t < TK; t++) s[r][t] = -FLT_MAX;
        }
    /* Online softmax, 16 rows at once where it can: each row's new max, the rescale of
     * its running sum and outputs (e^(old max - new max): e^-80 on the first step, the old
     * max -FLT_MAX and sum and outputs 0), its probabilities e^(s - max) to bf16 and their
     * sum. Every row sees token 0, so after the first step max is a real score. */
    float new_max[16], rescale[16];
    for (int r = 0; r < 16; r++)
        new_max[r] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_loadu_ps(&s[r][0]),
                                                        _mm512_loadu_ps(&s[r][16])));
    const __m512 old = _mm512_loadu_ps(w->max + rb);
    const __m512 m = _mm512_max_ps(old, _mm512_loadu_ps(new_max));
    _mm512_storeu_ps(rescale, exp_nonpositive(_mm512_sub_ps(old, m)));
    _mm512_storeu_ps(w->max + rb, m);
    _mm512_storeu_ps(new_max, m);
    uint16_t p[16][TK];
    for (int r = 0; r < 16; r++) {
        const __m512 row_max = _mm512_set1_ps(new_max[r]);
        const __m512 e0 = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(&s[r][0]), row_max));
        const __m512 e1 = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(&s[r][16]), row_max));
        w->sum[rb + r] = w->sum[rb + r] * rescale[r] + _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
        _mm512_storeu_si512(p[r], (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
    }
    _tile_loadd(2, &p[0][0], sizeof p[0]);
    float pv[16][64];
    for (int e0 = 0; e0 < head_dim / 16; e0 += 4) {
        const int ne = head_dim / 16 - e0 < 4 ? head_dim / 16 - e0 : 4;
        /* tile numbers are immediates: one line per product */
#define PRODUCT(J, TILE)                                                \
    if (J < ne) {                                                       \
        _tile_zero(TILE);                                               \
        _tile_loadd(3, w->vt + (int64_t)(e0 + J) * 512, 64);            \
        _tile_dpbf16ps(TILE, 2, 3);                                     \
        _tile_stored(TILE, &pv[0][16 * J], sizeof pv[0]);               \
    }
        PRODUCT(0, 4) PRODUCT(1, 5) PRODUCT(2, 6) PRODUCT(3, 7)
#undef PRODUCT
        for (int r = 0; r < 16; r++) {
            float *o = w->o + (int64_t)(rb + r) * head_dim + 16 * e0;
            const __m512 scale = _mm512_set1_ps(rescale[r]);
            for (int j = 0; j < ne; j++)
                _mm512_storeu_ps(o + 16 * j, _mm512_fmadd_ps(_mm512_loadu_ps(o + 16 * j), scale,
                                                             _mm512_loadu_ps(&pv[r][16 * j])));
        }
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
    const int rows = (used + 15) / 16 * 16;
    const int64_t len = first_pos + nq;
    for (int r = 0; r < rows; r++) {
        uint16_t *dst = w->q + (int64_t)r * head_dim;
        const float *src = q + row_offset(r, group, g, q_stride, head_dim);
        for (int d = 0; d < head_dim; d += 16) {
            const __m512 x = r < used ? _mm512_mul_ps(_mm512_loadu_ps(src + d),
                                                      _mm512_set1_ps(scale))
                                      : _mm512_setzero_ps(); /* padding: output dropped */
            _mm256_storeu_si256((__m256i *)(dst + d), (__m256i)_mm512_cvtneps_pbh(x));
        }
        memset(w->o + (int64_t)r * head_dim, 0, head_dim * sizeof(float));
        w->sum[r] = 0.f;
        w->max[r] = -FLT_MAX;
        w->query[r] = r < used ? r / group : nq - 1;
    }
    for (int64_t start = 0; start < len; start += TK) {
        const uint16_t *k[TK], *v[TK];
        bf16_step_rows(k_cache, v_cache, table, start, len, TK, block_size, num_kv_heads,
                       head_dim, g, w->zero, k, v);
        pack_keys(k, head_dim, w->kt);
        pack_values(v, head_dim, w->vt);
        for (int rb = 0; rb < rows; rb += 16) row_block_step(w, rb, head_dim, start, first_pos);
    }
    write_outputs(out, w->o, head_dim, 1, w->sum, used, group, g, num_heads, head_dim);
}
#endif

int paged_prefill_attention_amx(const float *q, const uint16_t *k_cache,
                                const uint16_t *v_cache, const int64_t *block_table,
                                const int64_t *query_start_loc, const int64_t *seq_lens,
                                float *out, int num_reqs, int num_heads, int num_kv_heads,
                                int head_dim, int block_size, int max_blocks, int64_t q_stride,
                                float scale, int num_threads) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
    if (head_dim % 32 || head_dim > MAX_DIM || !amx_permitted()) return -1;
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
    const int64_t rows = (tile * group + 15) / 16 * 16;
    int failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
        scratch w;
        char *buf = aligned_alloc(64, (size_t)(rows * head_dim * 6 + rows * 8 + rows * 4
                                               + 2 * head_dim * TK * 2 + MAX_DIM * 2 + 64)
                                          / 64 * 64 + 64);
        if (buf) {
            w.o = (float *)buf;
            w.max = w.o + rows * head_dim;
            w.sum = w.max + rows;
            w.query = (int *)(w.sum + rows);
            w.q = (uint16_t *)(w.query + rows);
            w.kt = w.q + rows * head_dim;
            w.vt = w.kt + head_dim * TK;
            w.zero = w.vt + head_dim * TK;
            memset(w.zero, 0, MAX_DIM * 2);
            configure_tiles();
        } else {
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        }
        attend_bf16_items(&args, items, num_items, tile, attend_item, buf ? &w : NULL);
        if (buf) {
            _tile_release();
            free(buf);
        }
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
