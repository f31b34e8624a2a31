/* The thresholds of sampler.c's top-k and top-p: quickselects over a row's candidate
 * values, the k-th largest (kth_of) and the value where the mass above crosses top_p
 * (select_top_p, weighted by each value's probability). */
#ifndef MINIVLLM_SAMPLER_SELECT_H
#define MINIVLLM_SAMPLER_SELECT_H

#include <float.h>
#include <stdint.h>

#define NO_LIMIT (-FLT_MAX) /* a disabled threshold (finite: -ffast-math assumes no inf) */

/* The selections' buffers, each with room for the values searched (and their masses). */
typedef struct {
    float *work[2], *work_rel[2];
} SelectBuffers;

/* One step of a selection: v[0:n] (and their masses w, if not NULL) split around pivot
 * into out (and out_w): the values above it at the front, those below at the back. No
 * branch on the values: every value is written to both ends and counted at one. The
 * masses are summed in a loop of their own, which vectorizes. */
typedef struct {
    int64_t greater, less;
    double greater_mass, equal_mass;
} Split;

static Split split(const float *v, const float *w, int64_t n, float pivot, float *out,
                   float *out_w) {
    Split s = {0, 0, 0., 0.};
    for (int64_t i = 0; i < n; i++) {
        const float x = v[i];
        out[s.greater] = x, out[n - 1 - s.less] = x;
        if (w) out_w[s.greater] = w[i], out_w[n - 1 - s.less] = w[i];
        s.greater += x > pivot;
        s.less += x < pivot;
    }
    if (w) {
        double greater = 0., equal = 0.;
#pragma omp simd reduction(+ : greater, equal)
        for (int64_t i = 0; i < n; i++) {
            greater += v[i] > pivot ? w[i] : 0.f;
            equal += v[i] == pivot ? w[i] : 0.f;
        }
        s.greater_mass = greater, s.equal_mass = equal;
    }
    return s;
}

static float median3(const float *v, int64_t n) {
    const float a = v[0], b = v[n / 2], c = v[n - 1];
    return a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
}

/* The k-th largest of v[0:n] (1 <= k <= n, ties counted), by quickselect; v is left as
 * is, b->work[0] and [1] hold the parts still searched. */
static float kth_of(const float *v, int64_t n, int64_t k, SelectBuffers *b) {
    for (int turn = 0;; turn ^= 1) {
        const float pivot = median3(v, n);
        float *out = b->work[turn];
        const Split p = split(v, NULL, n, pivot, out, NULL);
        if (k <= p.greater) {
            v = out, n = p.greater;
        } else if (k <= n - p.less) {
            return pivot;
        } else {
            k -= n - p.less;
            v = out + n - p.less, n = p.less;
        }
    }
}

/* top-p's threshold over v[0:n] (an upper set of the row: every token with a larger y is
 * in it, or outside with mass_above < limit): a token is kept iff the mass of the tokens
 * with a strictly larger y is < limit, so ties are kept or dropped together and the kept
 * set is {y >= t}. Returns t, by a quickselect weighted by mass: the split around a pivot
 * value tells whether the pivot is kept, and the search goes on in the part above it (if
 * not) or below it (if so); the parts go to b->work[turn] and [turn ^ 1]. */
static float select_top_p(const float *v, const float *w, int64_t n, double limit,
                          double mass_above, int turn, SelectBuffers *b) {
    /* Invariant: mass_above, the mass of the tokens above v[0:n], is < limit, so the
     * largest of v[0:n] is kept; and every token below v[0:n] is dropped. */
    float threshold = NO_LIMIT;
    for (; n > 0; turn ^= 1) {
        const float pivot = median3(v, n);
        float *out = b->work[turn], *out_w = b->work_rel[turn];
        const Split p = split(v, w, n, pivot, out, out_w);
        if (mass_above + p.greater_mass >= limit) { /* the pivot is dropped: t is above */
            v = out, w = out_w, n = p.greater;
            continue;
        }
        threshold = pivot; /* kept, and all above it */
        mass_above += p.greater_mass + p.equal_mass;
        if (mass_above >= limit) break; /* everything below is dropped */
        v = out + n - p.less, w = out_w + n - p.less, n = p.less;
    }
    return threshold;
}

#endif
