/* The LoRA deltas of a step's adapters in one call per linear (lora/layers.py), a segment
 * GEMM in the manner of punica's SGMV: the step's rows, grouped by adapter (segment s owns
 * rows[seg[s]..seg[s + 1])), each get
 *
 *   y[row] += (x[row] @ a[s]^T) @ b[s]      a[s]: [r, k] (PEFT's A), b[s]: [r, n] (B^T, scaled)
 *
 * accumulated into the base linear's output y in place: no gather of x, no padding to the
 * longest segment, no scatter of a delta. Shrink (h = x a^T, [rows, r]) then expand, each a
 * register-blocked tile of RB rows of one segment: RB x JB dot products over k sharing their
 * loads, then RB rows x CB columns accumulated over r from one row of b at a time. GCC's
 * vector types (VL floats: zmm with AVX-512, ymm below) give the registers at every ISA level
 * build.py compiles, and a copy of each tile per row count keeps its accumulators there. Shrink tasks are segments x row tiles, expand tasks segments x column
 * blocks: each output element is written by one thread. */
#include <stdint.h>
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

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline float sum(vf v) {
    float s = 0.f;
    for (int l = 0; l < VL; l++) s += v[l];
    return s;
}

/* h[i][j] for the tile's rows (nr <= RB) and ranks j0..j0 + JB (those below r). */
static inline __attribute__((always_inline)) void shrink_tile(
    const float *x, int64_t ldx, const int64_t *rows, int nr, const float *as, int j0, int r,
    int k, float *h) {
    vf acc[RB][JB];
    const float *xr[RB], *aj[JB];
    for (int i = 0; i < RB; i++) xr[i] = x + rows[i < nr ? i : 0] * ldx;
    for (int j = 0; j < JB; j++) aj[j] = as + (int64_t)(j0 + j < r ? j0 + j : j0) * k;
    for (int i = 0; i < RB; i++)
        for (int j = 0; j < JB; j++) acc[i][j] = (vf){0};
    int c = 0;
    for (; c + VL <= k; c += VL) {
        vf xv[RB], av[JB];
        for (int i = 0; i < RB; i++) xv[i] = load(xr[i] + c);
        for (int j = 0; j < JB; j++) av[j] = load(aj[j] + c);
        for (int i = 0; i < RB; i++)
            for (int j = 0; j < JB; j++) acc[i][j] += xv[i] * av[j];
    }
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < JB && j0 + j < r; j++) {
            float s = sum(acc[i][j]);
            for (int t = c; t < k; t++) s += xr[i][t] * aj[j][t];
            h[(int64_t)i * r + j0 + j] = s;
        }
}

/* y's rows (nr <= RB) at columns c0..c0 + CB += h's rows times b's columns */
static inline __attribute__((always_inline)) void expand_tile(
    float *y, int64_t ldy, const int64_t *rows, int nr, const float *h, const float *bs, int r,
    int n, int c0) {
    vf acc[RB][4];
    for (int i = 0; i < nr; i++)
        for (int v = 0; v < 4; v++) acc[i][v] = load(y + rows[i] * ldy + c0 + v * VL);
    for (int j = 0; j < r; j++) {
        vf bv[4];
        for (int v = 0; v < 4; v++) bv[v] = load(bs + (int64_t)j * n + c0 + v * VL);
        for (int i = 0; i < nr; i++) {
            const vf hv = (vf){0} + h[(int64_t)i * r + j];
            for (int v = 0; v < 4; v++) acc[i][v] += hv * bv[v];
        }
    }
    for (int i = 0; i < nr; i++)
        for (int v = 0; v < 4; v++) store(y + rows[i] * ldy + c0 + v * VL, acc[i][v]);
}

void lora_sgmv_f32(const float *x, int64_t ldx, float *y, int64_t ldy, const int64_t *rows,
                   const int64_t *seg, int segments, const float *a, const float *b, float *h,
                   int k, int r, int n, int num_threads) {
    const int64_t total = seg[segments];
    const int full = n / CB * CB;
#pragma omp parallel num_threads(num_threads) if (total * (int64_t)(k + n) * r > 1 << 16)
    {
#pragma omp for collapse(2) schedule(static)
        for (int s = 0; s < segments; s++) {
            for (int j0 = 0; j0 < (r + JB - 1) / JB * JB; j0 += JB) {
                const float *as = a + (int64_t)s * r * k;
                for (int64_t i = seg[s]; i < seg[s + 1]; i += RB) {
                    const int nr = seg[s + 1] - i < RB ? (int)(seg[s + 1] - i) : RB;
                    switch (nr) { /* one inlined copy per row count: acc in registers */
#define SHRINK(NR) \
    case NR: shrink_tile(x, ldx, rows + i, NR, as, j0, r, k, h + i * r); break;
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
            for (int c0 = 0; c0 < n; c0 += CB) {
                const float *bs = b + (int64_t)s * r * n;
                for (int64_t i = seg[s]; i < seg[s + 1]; i += RB) {
                    const int nr = seg[s + 1] - i < RB ? (int)(seg[s + 1] - i) : RB;
                    if (c0 < full) {
                        switch (nr) {
#define EXPAND(NR) \
    case NR: expand_tile(y, ldy, rows + i, NR, h + i * r, bs, r, n, c0); break;
                            EXPAND(1) EXPAND(2)
#if RB > 2
                            EXPAND(3) EXPAND(4)
#endif
#undef EXPAND
                        }
                        continue;
                    }
                    for (int q = 0; q < nr; q++) /* the last columns, past whole tiles */
                        for (int c = c0; c < n; c++) {
                            float v = y[rows[i + q] * ldy + c];
                            for (int j = 0; j < r; j++)
                                v += h[(i + q) * r + j] * bs[(int64_t)j * n + c];
                            y[rows[i + q] * ldy + c] = v;
                        }
                }
            }
        }
    }
}
