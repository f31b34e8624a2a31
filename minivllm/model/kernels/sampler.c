/* The sampler, fp32, CPU: penalties, min_tokens bans, greedy, temperature, top-k, top-p,
 * min-p and the draw, one fused pass per row, rows split over OpenMP threads. The torch
 * path of minivllm/model/sampler.py is the reference: same semantics, same arithmetic
 * where it decides a token (see the comments there), so both pick the same token.
 *
 * No sort of the vocabulary: every filter is a threshold on the (penalized) logit y, so
 * the kept set is "y >= t". One pass takes the maxima of the row's blocks; with top-k, the
 * few candidates that can pass are then collected from the blocks whose maximum passes a
 * cut (the k-th largest block maximum), and top-k's and top-p's thresholds are quickselects
 * over them; so is top-p's alone on a peaked row. On a flat row (many tokens carry mass),
 * top-p goes through a histogram of the whole row and a quickselect in the one bin where
 * the mass crosses top_p. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "sampler_select.h"

#define BLOCK 32         /* a block's max is checked before its elements are looked at */
#define DRAW_BLOCK 256   /* the draw over a whole row finds its block, then its token */
#define MIN_EXPONENT (-200.f) /* exp of this is 0 in fp32; keeps expf away from -inf */

/* Per-row parameters, packed by the caller into [rows, NUM_F] floats and [rows, NUM_I]
 * int64s. inv_temp 0 means greedy; top_k 0 disabled; top_p 1 disabled; log_min_p
 * NO_LIMIT disabled. */
enum { F_INV_TEMP, F_TOP_P, F_LOG_MIN_P, F_REP, F_INV_REP, NUM_F };
enum { I_TOP_K, I_KEY, I_POSITION, NUM_I };

/* splitmix64's finalizer: the same arithmetic as _mix64 in sampler.py. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The uniform in [0, 1) of a request (its key) at one output position: 53 random bits. */
static double uniform(uint64_t key, int64_t position) {
    return (double)(mix64(key + (uint64_t)(position + 1) * 0x9E3779B97F4A7C15ull) >> 11)
           * 0x1p-53;
}

void sampler_uniforms_f64(const int64_t *keys, const int64_t *positions, double *out,
                          int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = uniform((uint64_t)keys[i], positions[i]);
}

static float row_max(const float *y, int64_t n) {
    float best = y[0];
#pragma omp simd reduction(max : best)
    for (int64_t i = 0; i < n; i++) best = y[i] > best ? y[i] : best;
    return best;
}

/* The first index of the largest value, as torch.argmax. */
static int64_t row_argmax(const float *y, int64_t n) {
    const float best = row_max(y, n);
    int64_t i = 0;
    while (i < n - 1 && y[i] != best) i++;
    return i;
}

/* The largest of x[0:len], BLOCK values unrolled into a few vector instructions. */
static inline float block_max(const float *x, int64_t len) {
    if (len < BLOCK) return row_max(x, len);
    float best = x[0];
#pragma omp simd reduction(max : best)
    for (int i = 0; i < BLOCK; i++) best = x[i] > best ? x[i] : best;
    return best;
}

/* exp((y - m) * inv_temp): the probability relative to the most likely token. The
 * expression is the torch path's, operation for operation. */
static inline float relative(float y, float m, float inv_temp) {
    return expf(fmaxf((y - m) * inv_temp, MIN_EXPONENT));
}

typedef struct {
    float *tops;                      /* the maxima of the row's blocks */
    int32_t *ids;                     /* candidates: token, value, relative probability */
    float *vals, *rel;
    SelectBuffers select;             /* the thresholds' (sampler_select.h) */
    double *block_sums;
} Scratch;

/* The maxima of y's blocks, into tops; returns the largest. */
static float block_tops(const float *y, int64_t n, float *tops) {
    float m = y[0];
    for (int64_t b = 0; b * BLOCK < n; b++) {
        const int64_t len = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK;
        tops[b] = block_max(y + b * BLOCK, len);
        m = tops[b] > m ? tops[b] : m;
    }
    return m;
}

/* Collects, in token order, the tokens with y >= cut, looking only into the blocks whose
 * maximum passes (ids and vals have room for n + BLOCK: a rejected value is written too). */
static int64_t collect(const float *y, int64_t n, const float *tops, float cut, int32_t *ids,
                       float *vals) {
    int64_t count = 0;
    for (int64_t b = 0; b * BLOCK < n; b++) {
        if (tops[b] < cut) continue;
        const int64_t end = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n;
        for (int64_t j = b * BLOCK; j < end; j++) { /* written always, kept if it passes */
            ids[count] = (int32_t)j;
            vals[count] = y[j];
            count += y[j] >= cut;
        }
    }
    return count;
}

/* A y below which (y - m) * inv_temp < d, whatever the rounding (with room to spare). */
static float cut_for(float m, float inv_temp, float d) {
    const double cut = m + (double)d / inv_temp;
    return (float)(cut - 1e-5 * (fabs(cut) + fabs(m)) - 1e-30);
}

#define HIST_BINS 1024 /* draw_top_p_dense's histogram */

/* Whether few of the row's blocks (under an eighth) have a value at or above cut: then
 * few tokens carry the mass and collecting candidates beats a pass over the whole row. */
static int few_blocks_pass(const float *tops, int64_t n, float cut) {
    const int64_t blocks = (n + BLOCK - 1) / BLOCK;
    int64_t passing = 0;
#pragma omp simd reduction(+ : passing)
    for (int64_t b = 0; b < blocks; b++) passing += tops[b] >= cut;
    return passing * 8 < blocks;
}

/* top-p (and min-p) over the whole row, for a row with no top-k where many tokens may carry
 * mass (a flat distribution: a random-weight model, a high temperature), so instead of
 * collecting candidates, one vectorized pass takes every token's relative probability, a
 * histogram of the values weighted by them finds the bin where the mass above crosses the
 * limit (kept above it, dropped below), the exact threshold is searched in that bin only,
 * and the draw walks block sums. */
static int64_t draw_top_p_dense(const float *y, int64_t vocab, float m, float inv_temp,
                                float top_p, float log_min_p, double u, Scratch *s) {
    float *rel = s->rel;
    double base = 0.;
    float lo = m;
#pragma omp simd reduction(+ : base) reduction(min : lo)
    for (int64_t i = 0; i < vocab; i++) {
        rel[i] = relative(y[i], m, inv_temp);
        base += rel[i];
        lo = fminf(lo, y[i]);
    }
    lo = fmaxf(lo, m + MIN_EXPONENT / inv_temp); /* below it the mass is 0 (and -inf bans) */
    const double limit = top_p * base;
    const float scale = m > lo ? (HIST_BINS - 1) / (m - lo) : 0.f;
    double hist[4][HIST_BINS]; /* four, interleaved: no chain of adds on one bin */
    memset(hist, 0, sizeof(hist));
    for (int64_t i = 0; i < vocab; i++) hist[i & 3][(int)((fmaxf(y[i], lo) - lo) * scale)] += rel[i];
    double above = 0.;
    int bin = HIST_BINS - 1;
    for (;; bin--) {
        const double h = hist[0][bin] + hist[1][bin] + hist[2][bin] + hist[3][bin];
        if (bin == 0 || above + h >= limit) break;
        above += h;
    }
    int64_t count = 0;
    float *in = s->select.work[1], *in_w = s->select.work_rel[1];
    for (int64_t i = 0; i < vocab; i++) { /* the crossing bin's values, branch-free */
        in[count] = y[i], in_w[count] = rel[i];
        count += (int)((fmaxf(y[i], lo) - lo) * scale) == bin;
    }
    const float t_p = select_top_p(in, in_w, count, limit, above, 0, &s->select);
#define KEPT(i) (y[i] >= t_p && (y[i] - m) * inv_temp >= log_min_p)
    const int64_t blocks = (vocab + DRAW_BLOCK - 1) / DRAW_BLOCK;
    double total = 0.;
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t end = (b + 1) * DRAW_BLOCK < vocab ? (b + 1) * DRAW_BLOCK : vocab;
        double sum = 0.;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = b * DRAW_BLOCK; i < end; i++) sum += KEPT(i) ? rel[i] : 0.f;
        s->block_sums[b] = sum;
        total += sum;
    }
    const double target = u * total;
    double acc = 0.;
    int64_t b = 0, last = -1;
    while (b < blocks - 1 && acc + s->block_sums[b] <= target) acc += s->block_sums[b++];
    for (int64_t i = b * DRAW_BLOCK; i < vocab; i++) { /* to the end: sums may round apart */
        const float mass = KEPT(i) ? rel[i] : 0.f;
        if ((acc += mass) > target) return i;
        last = mass > 0.f ? i : last;
    }
    for (int64_t i = b * DRAW_BLOCK - 1; i >= 0 && last < 0; i--)
        last = KEPT(i) && rel[i] > 0.f ? i : -1;
#undef KEPT
    return last >= 0 ? last : row_argmax(y, vocab);
}

/* The top-k candidates of a row y (0 < k < n): the tokens with y >= the k-th largest
 * value (ties included), in token order in s->ids and s->vals. The k-th largest of the
 * block maxima is a cut that at least k tokens pass (the k blocks' maxima), and only the
 * blocks whose maximum passes it are looked into. */
static int64_t top_k_candidates(const float *y, int64_t n, int64_t k, Scratch *s) {
    const int64_t blocks = (n + BLOCK - 1) / BLOCK;
    const float cut = k <= blocks ? kth_of(s->tops, blocks, k, &s->select) : NO_LIMIT;
    int64_t count = collect(y, n, s->tops, cut, s->ids, s->vals);
    /* Fewer than k finite values: the -inf ones (banned) complete the top k, and have no
     * mass, so every finite value is a candidate. */
    const float kth = count < k ? NO_LIMIT : kth_of(s->vals, count, k, &s->select);
    int64_t kept = 0;
    for (int64_t c = 0; c < count; c++) { /* keep those >= kth, in order */
        s->ids[kept] = s->ids[c];
        s->vals[kept] = s->vals[c];
        kept += s->vals[c] >= kth;
    }
    return kept;
}

/* Draw from the whole row (temperature only): block sums first, then the token inside. */
static int64_t draw_all(const float *y, int64_t n, float m, float inv_temp, double u,
                        float *rel, double *block_sums) {
    const int64_t blocks = (n + DRAW_BLOCK - 1) / DRAW_BLOCK;
    double total = 0.;
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t start = b * DRAW_BLOCK, end = start + DRAW_BLOCK < n ? start + DRAW_BLOCK : n;
        double sum = 0.;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = start; i < end; i++) {
            rel[i] = relative(y[i], m, inv_temp);
            sum += rel[i];
        }
        block_sums[b] = sum;
        total += sum;
    }
    const double target = u * total;
    double acc = 0.;
    int64_t b = 0;
    while (b < blocks - 1 && acc + block_sums[b] <= target) acc += block_sums[b++];
    for (int64_t i = b * DRAW_BLOCK; i < n; i++) /* to the end: the sums may round apart */
        if ((acc += rel[i]) > target) return i;
    int64_t last = n - 1; /* u * total rounded up to total: the last token that has mass */
    while (last > 0 && rel[last] == 0.f) last--;
    return last;
}

/* The token of one row y (penalties applied) whose parameters are fp, ip. */
static int64_t sample_row(const float *y, int64_t vocab, const float *fp, const int64_t *ip,
                          Scratch *s) {
    const float inv_temp = fp[F_INV_TEMP], top_p = fp[F_TOP_P], log_min_p = fp[F_LOG_MIN_P];
    const int64_t top_k = ip[I_TOP_K];
    if (inv_temp == 0.f) return row_argmax(y, vocab);
    const double u = uniform((uint64_t)ip[I_KEY], ip[I_POSITION]);
    if (top_k == 0 && top_p >= 1.f && log_min_p == NO_LIMIT)
        return draw_all(y, vocab, row_max(y, vocab), inv_temp, u, s->rel, s->block_sums);

    /* Candidates, an upper set of the row holding every token that can be kept: the top-k
     * set (ties included); else the tokens that may pass min-p and top-p. */
    const float m = block_tops(y, vocab, s->tops);
    if (top_k == 0 && top_p < 1.f && !few_blocks_pass(s->tops, vocab, cut_for(m, inv_temp, -8.f)))
        return draw_top_p_dense(y, vocab, m, inv_temp, top_p, log_min_p, u, s);
    double base_mass = 0.; /* the mass top-p is a fraction of: the top-k set's, or all */
    int64_t n;
    if (top_k > 0) {
        n = top_k_candidates(y, vocab, top_k, s);
        for (int64_t c = 0; c < n; c++) base_mass += s->rel[c] = relative(s->vals[c], m, inv_temp);
    } else if (top_p >= 1.f) { /* min-p alone */
        n = collect(y, vocab, s->tops, cut_for(m, inv_temp, log_min_p), s->ids, s->vals);
        for (int64_t c = 0; c < n; c++) s->rel[c] = relative(s->vals[c], m, inv_temp);
    } else { /* top-p on a peaked row: the few tokens that can carry its mass */
#pragma omp simd reduction(+ : base_mass)
        for (int64_t i = 0; i < vocab; i++) base_mass += relative(y[i], m, inv_temp);
        /* A token whose relative probability is below (1 - top_p) total / (2 vocab) cannot
         * pass top-p: all such tokens together hold less than 1 - top_p of the mass, so
         * the mass above any of them is more than top_p of it. That floor lets in much of
         * a long tail, so cuts from e^-8 down to e^-32 are tried first: a cut is enough
         * once the candidates above it hold more than top_p of the mass. */
        const double limit = top_p * base_mass;
        const float floor_cut = logf((float)(0.5 * (1. - top_p) * base_mass / vocab));
        const float tries[] = {-8.f, -12.f, -16.f, -24.f, -32.f, floor_cut};
        for (int t = 0;; t++) {
            const float d_cut = fmaxf(log_min_p, fmaxf(tries[t], floor_cut));
            n = collect(y, vocab, s->tops, cut_for(m, inv_temp, d_cut), s->ids, s->vals);
            double mass = 0.;
            for (int64_t c = 0; c < n; c++) mass += s->rel[c] = relative(s->vals[c], m, inv_temp);
            if (d_cut == floor_cut || d_cut == log_min_p || mass > limit * (1. + 1e-6)) break;
        }
    }
    const float t_p = top_p < 1.f
                          ? select_top_p(s->vals, s->rel, n, top_p * base_mass, 0., 0, &s->select)
                          : NO_LIMIT;

    /* The draw: inverse CDF over the kept candidates in token order (without branches on
     * the values: the cumulative mass only grows at kept tokens, so the first to pass the
     * target is one). */
#define KEPT(c) (s->vals[c] >= t_p && (s->vals[c] - m) * inv_temp >= log_min_p)
    /* Block sums first (vectorized), so the scan for the target only walks one block. */
    const int64_t blocks = (n + DRAW_BLOCK - 1) / DRAW_BLOCK;
    double total = 0.;
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t end = (b + 1) * DRAW_BLOCK < n ? (b + 1) * DRAW_BLOCK : n;
        double sum = 0.;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = b * DRAW_BLOCK; c < end; c++) sum += KEPT(c) ? s->rel[c] : 0.f;
        s->block_sums[b] = sum;
        total += sum;
    }
    const double target = u * total;
    double acc = 0.;
    int64_t b = 0, last = -1;
    while (b < blocks - 1 && acc + s->block_sums[b] <= target) acc += s->block_sums[b++];
    for (int64_t c = b * DRAW_BLOCK; c < n; c++) { /* to the end: the sums may round apart */
        const float mass = KEPT(c) ? s->rel[c] : 0.f;
        if ((acc += mass) > target) return s->ids[c];
        last = mass > 0.f ? c : last;
    }
    for (int64_t c = b * DRAW_BLOCK - 1; c >= 0 && last < 0; c--) /* rounding: the last kept */
        last = KEPT(c) && s->rel[c] > 0.f ? c : -1;
#undef KEPT
    return last >= 0 ? s->ids[last] : row_argmax(y, vocab); /* rounding; or nothing kept */
}

/* One token per row of logits [rows, vocab].
 *   fparams [rows, NUM_F], iparams [rows, NUM_I]: see the enums above
 *   seen_off [rows + 1], seen_ids: per row, the prompt and output tokens (repetition
 *     penalty; none when it is 1)
 *   pen_off [rows + 1], pen_ids, pen_deltas: per row, the output tokens and the amount
 *     subtracted from each (frequency * count + presence)
 *   ban_off [rows + 1], ban_ids: per row, the tokens banned this step (min_tokens)
 *   out [rows]: the sampled tokens
 * The penalties are applied to the logits in place, and the touched values restored when
 * the row is done (cheaper than copying the row): the logits are unchanged on return. */
void sample_rows_f32(float *logits, int64_t rows, int64_t vocab, const float *fparams,
                     const int64_t *iparams, const int64_t *seen_off, const int32_t *seen_ids,
                     const int64_t *pen_off, const int32_t *pen_ids, const float *pen_deltas,
                     const int64_t *ban_off, const int32_t *ban_ids, int64_t *out,
                     int num_threads) {
    int64_t most_edits = 0;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t edits = seen_off[r + 1] - seen_off[r] + pen_off[r + 1] - pen_off[r]
                              + ban_off[r + 1] - ban_off[r];
        most_edits = edits > most_edits ? edits : most_edits;
    }
#pragma omp parallel num_threads(num_threads) if (rows > 1)
    {
        Scratch s;
        const size_t size = (size_t)(vocab + BLOCK) * sizeof(float);
        s.tops = malloc(size / BLOCK + sizeof(float));
        s.ids = malloc(size), s.vals = malloc(size), s.rel = malloc(size);
        for (int i = 0; i < 2; i++)
            s.select.work[i] = malloc(size), s.select.work_rel[i] = malloc(size);
        s.block_sums = malloc((size_t)(vocab / DRAW_BLOCK + 1) * sizeof(double));
        float *saved = malloc((size_t)(most_edits + 1) * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int64_t r = 0; r < rows; r++) {
            float *y = logits + r * vocab;
            const float *fp = fparams + r * NUM_F;
            const int32_t *seen = seen_ids + seen_off[r], *pens = pen_ids + pen_off[r],
                          *bans = ban_ids + ban_off[r];
            const int64_t num_seen = seen_off[r + 1] - seen_off[r],
                          num_pens = pen_off[r + 1] - pen_off[r],
                          num_bans = ban_off[r + 1] - ban_off[r];
            const float rep = fp[F_REP], inv_rep = fp[F_INV_REP];
            float *save = saved;
            for (int64_t j = 0; j < num_seen; j++) { /* the first touch of the row: prefetch */
                if (j + 16 < num_seen) __builtin_prefetch(y + seen[j + 16], 1);
                const float v = *save++ = y[seen[j]];
                y[seen[j]] = v * (v > 0.f ? inv_rep : rep); /* a select: the signs are random */
            }
            for (int64_t j = 0; j < num_pens; j++) {
                *save++ = y[pens[j]];
                y[pens[j]] -= pen_deltas[pen_off[r] + j];
            }
            for (int64_t j = 0; j < num_bans; j++) *save++ = y[bans[j]], y[bans[j]] = -INFINITY;
            out[r] = sample_row(y, vocab, fp, iparams + r * NUM_I, &s);
            /* Restore in reverse: a token touched twice gets its first saved value last. */
            for (int64_t j = num_bans - 1; j >= 0; j--) y[bans[j]] = *--save;
            for (int64_t j = num_pens - 1; j >= 0; j--) y[pens[j]] = *--save;
            for (int64_t j = num_seen - 1; j >= 0; j--) y[seen[j]] = *--save;
        }
        free(s.tops), free(s.ids), free(s.vals), free(s.rel), free(s.block_sums);
        for (int i = 0; i < 2; i++) free(s.select.work[i]), free(s.select.work_rel[i]);
        free(saved);
    }
}
