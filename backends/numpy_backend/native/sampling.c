/* Token sampling over whole rows of logits: temperature, min_p, top-k, top-p, and one inverse-CDF draw per row
 * from the row's own uniform number. The NumPy reference (backends/sampling.py) builds a probability array and a
 * float64 cumulative sum of it, about 2.5 ms a row for Gemma's 262,144 tokens (11 ms with top-p); here nothing
 * of the row's size is written.
 *
 * A row's weights are w_i = exp((x_i - max) / T), and 0 where w_i < min_p (min_p of the largest probability: the
 * largest weight is exp(0) = 1) or where the argument is below -87 (a -inf logit: a token a grammar or a
 * suppression forbids is never drawn). A first pass sums them per block of BLOCK; the draw is the first token
 * whose running sum (the blocks' sums before its block, then its block's weights one by one, in double) passes
 * u * total. Only the blocks the scan reaches are computed again, on the same boundaries, so it sees the very
 * weights the sums came from. A token of weight 0 never passes the target, so a filtered token is never drawn.
 *
 * Top-k and top-p keep the first R tokens in order of weight (ties by index): rank r is kept while r < k and the
 * weight ranked before it is under top_p of the total (the NumPy sampler's rule). The last kept token is the
 * row's cut; the draw then counts only tokens at or above it. It is found without sorting the row: a histogram
 * of the weights' top bits (count and mass per bucket) locates the bucket the cut falls in, and only that
 * bucket's tokens are sorted. The draw goes through the kept tokens in vocabulary order (NumPy's goes in order
 * of weight): the same distribution, another token for a given uniform.
 *
 * Rows are shared out among the OpenMP threads; a row's token depends on its logits and its uniform only. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "simd.h"
#include "softmax.h"

#define BLOCK 512         /* weights per partial sum: what the scan computes again (a multiple of LANES) */
#define EXP_FLOOR (-87.0f) /* exp_nonpositive's floor: arguments below it get weight 0 */

typedef struct {
    float top, inv_t, min_p;
    float cut_w;     /* kept: weight > cut_w, or == cut_w at index <= cut_at (0 and -1: every weight) */
    int64_t cut_at;
} RowScale;

#define BUCKET_SHIFT 20 /* a weight's bucket: its bits' top 12 (exponent and 3 mantissa bits) */
#define BUCKETS 4096

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static inline float scalar_weight(float x, RowScale s, int64_t at) {
    const float arg = (x - s.top) * s.inv_t;
    const float e = arg >= EXP_FLOOR ? expf(arg) : 0.0f; /* NaN compares false: weight 0 */
    const int above_cut = e > s.cut_w || (e == s.cut_w && at <= s.cut_at);
    return e >= s.min_p && above_cut ? e : 0.0f;
}

/* The weights of x[0..n), n <= BLOCK, the row's tokens from `at`, into w; returns their sum. */
static float block_weights(const float *x, int64_t n, RowScale s, int64_t at, float *w) {
    const vec8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
    vec8 sums = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        const vec8 arg = (*(const vec8 *)(x + i) - s.top) * s.inv_t;
        const vec8 e = exp_nonpositive(arg);
        const vec8i index = lane + (int32_t)(at + i);
        const vec8i above_cut = (e > s.cut_w) | ((e == s.cut_w) & (index <= (int32_t)s.cut_at));
        const vec8i keep = (arg >= EXP_FLOOR) & (e >= s.min_p) & above_cut;
        const vec8 kept = (vec8)((vec8i)e & keep);
        *(vec8 *)(w + i) = kept;
        sums += kept;
    }
    float tail = 0.0f;
    for (; i < n; i++) tail += w[i] = scalar_weight(x[i], s, at + i);
    return hsum(sums) + tail;
}

/* The first token whose running sum passes target, starting at block b with `before` summed ahead of it.
 * Rounding may carry the scan past the block its sums pointed to; past the end: the last token of weight. */
static int64_t scan_from(const float *x, int64_t vocab, RowScale s, int64_t b, double before, double target) {
    float w[BLOCK] __attribute__((aligned(64)));
    int64_t last = -1;
    for (int64_t start = b * BLOCK; start < vocab; start += BLOCK) {
        const int64_t n = min64(BLOCK, vocab - start);
        block_weights(x + start, n, s, start, w);
        for (int64_t i = 0; i < n; i++) {
            if (w[i] <= 0.0f) continue;
            last = start + i;
            before += w[i];
            if (before > target) return last;
        }
    }
    return last;
}

/* The first index holding the row's largest logit: the draw of a row with no weight (every logit -inf or NaN). */
static int64_t first_top(const float *x, int64_t vocab, float top) {
    for (int64_t i = 0; i < vocab; i++)
        if (x[i] == top) return i;
    return 0;
}

static double row_weights(const float *x, int64_t vocab, RowScale s, double *sums) {
    float w[BLOCK] __attribute__((aligned(64)));
    double total = 0.0;
    for (int64_t b = 0; b * BLOCK < vocab; b++)
        total += sums[b] = block_weights(x + b * BLOCK, min64(BLOCK, vocab - b * BLOCK), s, b * BLOCK, w);
    return total;
}

static int64_t draw(const float *x, int64_t vocab, RowScale s, double u, double *sums) {
    const int64_t blocks = (vocab + BLOCK - 1) / BLOCK;
    const double target = u * row_weights(x, vocab, s, sums);
    double before = 0.0;
    int64_t b = 0;
    while (b + 1 < blocks && before + sums[b] <= target) before += sums[b++];
    const int64_t token = scan_from(x, vocab, s, b, before, target);
    return token >= 0 ? token : first_top(x, vocab, s.top);
}

typedef struct {
    float w;
    int64_t at;
} Ranked;

static int by_rank(const void *a, const void *b) {
    const Ranked *p = a, *q = b;
    if (p->w != q->w) return p->w > q->w ? -1 : 1;
    return p->at < q->at ? -1 : p->at > q->at;
}

static inline int32_t bucket_of(float w) {
    uint32_t bits;
    __builtin_memcpy(&bits, &w, sizeof bits);
    return (int32_t)(bits >> BUCKET_SHIFT);
}

/* Every token of weight in `bucket`, sorted by rank; returns how many. */
static int64_t bucket_tokens(const float *x, int64_t vocab, RowScale s, int32_t bucket, Ranked *out) {
    float w[BLOCK] __attribute__((aligned(64)));
    int64_t count = 0;
    for (int64_t start = 0; start < vocab; start += BLOCK) {
        const int64_t n = min64(BLOCK, vocab - start);
        block_weights(x + start, n, s, start, w);
        for (int64_t i = 0; i < n; i++)
            if (w[i] > 0.0f && bucket_of(w[i]) == bucket) out[count++] = (Ranked){w[i], start + i};
    }
    qsort(out, (size_t)count, sizeof *out, by_rank);
    return count;
}

/* The weights' count and mass per bucket (s without a cut). */
static void histogram(const float *x, int64_t vocab, RowScale s, int64_t *count, double *mass) {
    float w[BLOCK] __attribute__((aligned(64)));
    for (int64_t start = 0; start < vocab; start += BLOCK) {
        const int64_t n = min64(BLOCK, vocab - start);
        block_weights(x + start, n, s, start, w);
        for (int64_t i = 0; i < n; i++) {
            if (w[i] <= 0.0f) continue;
            count[bucket_of(w[i])]++;
            mass[bucket_of(w[i])] += w[i];
        }
    }
}

/* s with its cut for top_k (> 0: on) and top_p (< 1: on) of `total`; 0 on success, -1 without memory. */
static int find_cut(const float *x, int64_t vocab, RowScale *s, int64_t top_k, double top_p, double total) {
    int64_t *count = calloc(BUCKETS, sizeof *count);
    double *mass = calloc(BUCKETS, sizeof *mass);
    int status = count && mass ? 0 : -1;
    if (!status) histogram(x, vocab, *s, count, mass);
    const double limit = top_p * total;
    int64_t ranked = 0; /* tokens in the buckets above */
    double before = 0.0;
    int32_t b = BUCKETS - 1;
    for (; !status && b >= 0; b--) {
        if (count[b] && ((top_k > 0 && ranked + count[b] >= top_k) || before + mass[b] >= limit)) break;
        ranked += count[b], before += mass[b];
    }
    if (!status && b >= 0) { /* the cut is in bucket b: walk its tokens in order of rank */
        Ranked *tokens = malloc(sizeof *tokens * (size_t)count[b]);
        if (!tokens) status = -1;
        const int64_t n = tokens ? bucket_tokens(x, vocab, *s, b, tokens) : 0;
        for (int64_t i = 0; i < n; i++, ranked++) {
            if (ranked > 0 && ((top_k > 0 && ranked >= top_k) || before >= limit)) break; /* the top one stays */
            s->cut_w = tokens[i].w, s->cut_at = tokens[i].at;
            before += tokens[i].w;
        }
        free(tokens);
    }
    free(count);
    free(mass);
    return status;
}

static int sample_row(const float *x, int64_t vocab, RowScale s, int64_t top_k, double top_p, double u,
                      double *sums, int64_t *out) {
    if (top_k > 0 || top_p < 1.0) {
        const int status = find_cut(x, vocab, &s, top_k, top_p, row_weights(x, vocab, s, sums));
        if (status) return status;
    }
    *out = draw(x, vocab, s, u, sums);
    return 0;
}

/* logits (rows, vocab) float32; per row: temperature > 0, min_p in [0, 1], top_k (0: off), top_p in (0, 1]
 * (1: off), a uniform in [0, 1) (double); out: the drawn token ids. Returns 0, -1 when scratch memory could not
 * be had, -2 for a vocabulary under 1. */
int sample_rows_f32(const float *logits, int64_t rows, int64_t vocab, const float *temperature, const float *min_p,
                    const int64_t *top_k, const float *top_p, const double *uniforms, int64_t *out) {
    if (vocab < 1) return -2;
    int status = 0;
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * vocab;
        double *sums = malloc(sizeof(double) * (size_t)((vocab + BLOCK - 1) / BLOCK));
        const RowScale s = {max_score(x, vocab), 1.0f / temperature[r], min_p[r], 0.0f, -1};
        const int row_status = sums ? sample_row(x, vocab, s, top_k[r], top_p[r], uniforms[r], sums, out + r) : -1;
        if (row_status) {
#pragma omp atomic write
            status = row_status;
        }
        free(sums);
    }
    return status;
}
