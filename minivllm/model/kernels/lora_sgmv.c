/* The LoRA deltas of a step's adapters in one call per linear (lora/layers.py), a segment
 * GEMM in the manner of punica's SGMV: the step's rows, grouped by adapter (segment s owns
 * rows[seg[s]..seg[s + 1])), each get
 *
 *   y[row] += (x[row] @ a[s]^T) @ B[s]      a[s]: [r, k] (PEFT's A of every slot stacked)
 *
 * accumulated into the base linear's output y in place: no gather of x, no padding to the
 * longest segment, no scatter of a delta. A fused linear (q/k/v, gate/up) has `slots`
 * projections: slot t owns the output columns bounds[t]..bounds[t + 1] and the r / slots
 * ranks t * r / slots.. of h = x a^T. B is block-diagonal and is given without its zeros:
 * b[s] is [r / slots, n], column c's ranks those of the slot that owns c. Decode steps read
 * every adapter's weights once per linear, so they stream from memory: the zeros would be
 * half of gate/up's B and two thirds of q/k/v's.
 *
 * The weights are fp32 or bf16 (lora_sgmv_bf16w: the adapters of a --dtype bfloat16
 * engine, half the bytes; widened to fp32 on load, fp32 arithmetic). Shrink then expand,
 * each a register-blocked tile of RB rows of one segment: RB x JB dot products over k
 * sharing their loads, then RB rows x CB columns of one slot accumulated over its ranks
 * from one row of b at a time. GCC's vector types (VL floats: zmm with AVX-512, ymm below)
 * give the registers at every ISA level build.py compiles, and a copy of each tile per row
 * count keeps its accumulators there. Shrink tasks are segments x rank tiles, expand tasks
 * segments x column tiles: each output element is written by one thread. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX512F__)
#define VL 16
#define RB 4
#else
#define VL 8
#define RB 2
#endif
#define JB 4       /* ranks per shrink tile */
#define CB (4 * VL) /* output columns per expand tile */

typedef float vf __attribute__((vector_size(VL * 4)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));
typedef uint16_t vh __attribute__((vector_size(VL * 2)));

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* VL weights from element i of w (fp32, or bf16 widened: its bits are an fp32's top half) */
static inline __attribute__((always_inline)) vf load_w(const void *w, int64_t i, int bf16) {
    if (!bf16) return load((const float *)w + i);
    vh half;
    memcpy(&half, (const uint16_t *)w + i, sizeof half);
    const vu bits = __builtin_convertvector(half, vu) << 16;
    vf v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) float scalar_w(const void *w, int64_t i,
                                                            int bf16) {
    if (!bf16) return ((const float *)w)[i];
    const uint32_t bits = (uint32_t)((const uint16_t *)w)[i] << 16;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static inline float sum(vf v) {
    float s = 0.f;
    for (int l = 0; l < VL; l++) s += v[l];
    return s;
}

/* h[i][j] for the tile's rows (nr <= RB) and ranks j0..j0 + JB (those below r); as: the
 * segment's a, [r, k]. */
static inline __attribute__((always_inline)) void shrink_tile(
    const float *x, int64_t ldx, const int64_t *rows, int nr, const void *as, int j0, int r,
    int k, float *h, int bf16) {
    vf acc[RB][JB];
    const float *xr[RB];
    int64_t aj[JB];
    for (int i = 0; i < RB; i++) xr[i] = x + rows[i < nr ? i : 0] * ldx;
    for (int j = 0; j < JB; j++) aj[j] = (int64_t)(j0 + j < r ? j0 + j : j0) * k;
    for (int i = 0; i < RB; i++)
        for (int j = 0; j < JB; j++) acc[i][j] = (vf){0};
    int c = 0;
    for (; c + VL <= k; c += VL) {
        vf xv[RB], av[JB];
        for (int i = 0; i < RB; i++) xv[i] = load(xr[i] + c);
        for (int j = 0; j < JB; j++) av[j] = load_w(as, aj[j] + c, bf16);
        for (int i = 0; i < RB; i++)
            for (int j = 0; j < JB; j++) acc[i][j] += xv[i] * av[j];
    }
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < JB && j0 + j < r; j++) {
            float s = sum(acc[i][j]);
            for (int t = c; t < k; t++) s += xr[i][t] * scalar_w(as, aj[j] + t, bf16);
            h[(int64_t)i * r + j0 + j] = s;
        }
}

/* y's rows (nr <= RB) at columns c0..c0 + CB += h's rows (from their slot's first rank)
 * times bs's columns over the slot's rs ranks; bs: the segment's b, [rs, n]. */
static inline __attribute__((always_inline)) void expand_tile(
    float *y, int64_t ldy, const int64_t *rows, int nr, const float *h, int r,
    const void *bs, int rs, int n, int c0, int bf16) {
    vf acc[RB][4];
    for (int i = 0; i < nr; i++)
        for (int v = 0; v < 4; v++) acc[i][v] = load(y + rows[i] * ldy + c0 + v * VL);
    for (int j = 0; j < rs; j++) {
        vf bv[4];
        for (int v = 0; v < 4; v++) bv[v] = load_w(bs, (int64_t)j * n + c0 + v * VL, bf16);
        for (int i = 0; i < nr; i++) {
            const vf hv = (vf){0} + h[(int64_t)i * r + j];
            for (int v = 0; v < 4; v++) acc[i][v] += hv * bv[v];
        }
    }
    for (int i = 0; i < nr; i++)
        for (int v = 0; v < 4; v++) store(y + rows[i] * ldy + c0 + v * VL, acc[i][v]);
}

/* The columns c0..c1 (< CB of them, at a slot's end) of nr rows, one at a time. */
static void expand_tail(float *y, int64_t ldy, const int64_t *rows, int nr, const float *h,
                        int r, const void *bs, int rs, int n, int c0, int c1, int bf16) {
    for (int i = 0; i < nr; i++)
        for (int c = c0; c < c1; c++) {
            float v = y[rows[i] * ldy + c];
            for (int j = 0; j < rs; j++)
                v += h[(int64_t)i * r + j] * scalar_w(bs, (int64_t)j * n + c, bf16);
            y[rows[i] * ldy + c] = v;
        }
}

static inline __attribute__((always_inline)) void sgmv(
    const float *x, int64_t ldx, float *y, int64_t ldy, const int64_t *rows,
    const int64_t *seg, int segments, const void *a, const void *b, const int64_t *bounds,
    int slots, float *h, int k, int r, int n, int num_threads, int bf16) {
    const int64_t total = seg[segments];
    const int rs = r / slots;
    const int elem = bf16 ? 2 : 4;
    /* The expand's column tiles, none across two slots: (first column, slot). */
    int (*tiles)[2] = malloc(sizeof *tiles * (size_t)(n / CB + 2 * slots));
    int num_tiles = 0;
    for (int t = 0; t < slots; t++)
        for (int c = (int)bounds[t]; c < bounds[t + 1]; c += CB) {
            tiles[num_tiles][0] = c;
            tiles[num_tiles++][1] = t;
        }
#pragma omp parallel num_threads(num_threads) if (total * (int64_t)(k + n) * rs > 1 << 16)
    {
#pragma omp for collapse(2) schedule(static)
        for (int s = 0; s < segments; s++) {
            for (int j0 = 0; j0 < (r + JB - 1) / JB * JB; j0 += JB) {
                const char *as = (const char *)a + (int64_t)s * r * k * elem;
                for (int64_t i = seg[s]; i < seg[s + 1]; i += RB) {
                    const int nr = seg[s + 1] - i < RB ? (int)(seg[s + 1] - i) : RB;
                    switch (nr) { /* one inlined copy per row count: acc in registers */
#define SHRINK(NR) \
    case NR: shrink_tile(x, ldx, rows + i, NR, as, j0, r, k, h + i * r, bf16); break;
                        SHRINK(1) SHRINK(2)
#if RB > 2
                        SHRINK(3) SHRINK(4)
#endif
#undef SHRINK
                    }
                }
            }
        }
#pragma omp for collapse(2) schedule(static)
        for (int s = 0; s < segments; s++) {
            for (int tile = 0; tile < num_tiles; tile++) {
                const char *bs = (const char *)b + (int64_t)s * rs * n * elem;
                const int c0 = tiles[tile][0], t = tiles[tile][1];
                const int c1 = c0 + CB < bounds[t + 1] ? c0 + CB : (int)bounds[t + 1];
                for (int64_t i = seg[s]; i < seg[s + 1]; i += RB) {
                    const int nr = seg[s + 1] - i < RB ? (int)(seg[s + 1] - i) : RB;
                    const float *hs = h + i * r + t * rs; /* the slot's ranks */
                    if (c1 - c0 < CB) {
                        expand_tail(y, ldy, rows + i, nr, hs, r, bs, rs, n, c0, c1, bf16);
                        continue;
                    }
                    switch (nr) {
#define EXPAND(NR) \
    case NR: expand_tile(y, ldy, rows + i, NR, hs, r, bs, rs, n, c0, bf16); break;
                        EXPAND(1) EXPAND(2)
#if RB > 2
                        EXPAND(3) EXPAND(4)
#endif
#undef EXPAND
                    }
                }
            }
        }
    }
    free(tiles);
}

void lora_sgmv_f32(const float *x, int64_t ldx, float *y, int64_t ldy, const int64_t *rows,
                   const int64_t *seg, int segments, const float *a, const float *b,
                   const int64_t *bounds, int slots, float *h, int k, int r, int n,
                   int num_threads) {
    sgmv(x, ldx, y, ldy, rows, seg, segments, a, b, bounds, slots, h, k, r, n, num_threads,
         0);
}

void lora_sgmv_bf16w(const float *x, int64_t ldx, float *y, int64_t ldy, const int64_t *rows,
                     const int64_t *seg, int segments, const uint16_t *a, const uint16_t *b,
                     const int64_t *bounds, int slots, float *h, int k, int r, int n,
                     int num_threads) {
    sgmv(x, ldx, y, ldy, rows, seg, segments, a, b, bounds, slots, h, k, r, n, num_threads,
         1);
}
