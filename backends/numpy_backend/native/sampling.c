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
 * row's cut; the draw then counts only tokens at or above it. It is found without sorting the row: a top-k of
 * at most MAX_TOP from the k largest logits (a sorted list of k that a compare of each block's largest lets
 * most of the row skip); otherwise histograms of the weights' bits (count and mass per bucket), a digit at a
 * time, narrow it to a bucket of at most SORT_MAX tokens, which are sorted, or of equal weights, which rank by
 * index as they are collected. The draw goes
 * through the kept tokens in vocabulary order (NumPy's goes in order of weight): the same distribution, another
 * token for a given uniform.
 *
 * Rows are shared out among the OpenMP threads; a row's token depends on its logits and its uniform only.
 *
 * row_logprobs_f32 gives what a request for logprobs wants of a row, also without writing the row's size: the
 * chosen token's log-probability (x - max) - log(sum(exp(x - max))), NumPy's log_softmax arithmetic, and the k
 * most likely tokens (ties by index) with theirs, found as top-k's are. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"
#include "softmax.h"

#define BLOCK 512         /* weights per partial sum: what the scan computes again (a multiple of LANES) */
#define EXP_FLOOR (-87.0f) /* exp_nonpositive's floor: arguments below it get weight 0 */

typedef struct {
    float top, inv_t, min_p;
    float cut_w;     /* kept: weight > cut_w, or == cut_w at index <= cut_at (0 and -1: every weight) */
    int64_t cut_at;
} RowScale;

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

/* A weight's bits: positive floats order as their bits do. */
static inline uint32_t key_of(float w) {
    uint32_t bits;
    __builtin_memcpy(&bits, &w, sizeof bits);
    return bits;
}

/* The select's digits of a key, most significant first: bits 20-31, 8-19, 0-7. A digit is looked into only
 * when its bucket holds more than SORT_MAX tokens; the last digit's buckets hold equal weights only. */
static const int DIGIT_SHIFT[3] = {20, 8, 0}, DIGIT_BITS[3] = {12, 12, 8};
#define SORT_MAX 1024

/* The tokens of weight whose key, shifted right by `shift`, is `prefix`, in rank order (sorted unless `sorted`
 * already: equal weights, collected in index order); returns how many. */
static int64_t bucket_tokens(const float *x, int64_t vocab, RowScale s, uint64_t prefix, int shift, int sort,
                             Ranked *out) {
    float w[BLOCK] __attribute__((aligned(64)));
    int64_t count = 0;
    for (int64_t start = 0; start < vocab; start += BLOCK) {
        const int64_t n = min64(BLOCK, vocab - start);
        block_weights(x + start, n, s, start, w);
        for (int64_t i = 0; i < n; i++)
            if (w[i] > 0.0f && key_of(w[i]) >> shift == prefix) out[count++] = (Ranked){w[i], start + i};
    }
    if (sort) qsort(out, (size_t)count, sizeof *out, by_rank);
    return count;
}

/* Count and mass per value of digit `d` among the weights whose higher digits are `prefix` (s without a cut). */
static void histogram(const float *x, int64_t vocab, RowScale s, uint64_t prefix, int d, int64_t *count,
                      double *mass) {
    float w[BLOCK] __attribute__((aligned(64)));
    const int high = DIGIT_SHIFT[d] + DIGIT_BITS[d];
    const uint32_t digits = (1u << DIGIT_BITS[d]) - 1;
    for (int64_t start = 0; start < vocab; start += BLOCK) {
        const int64_t n = min64(BLOCK, vocab - start);
        block_weights(x + start, n, s, start, w);
        for (int64_t i = 0; i < n; i++) {
            const uint64_t key = key_of(w[i]);
            if (w[i] <= 0.0f || key >> high != prefix) continue;
            count[key >> DIGIT_SHIFT[d] & digits]++;
            mass[key >> DIGIT_SHIFT[d] & digits] += w[i];
        }
    }
}

/* Where the cut falls among the tokens ranked from `*ranked` (and `*before` of mass) on: limits as find_cut's. */
typedef struct {
    int64_t top_k, ranked;
    double limit, before;
} CutWalk;

static inline int passes_cut(const CutWalk *c, int64_t count, double mass) {
    return (c->top_k > 0 && c->ranked + count >= c->top_k) || c->before + mass >= c->limit;
}

/* The highest digit value whose bucket the cut falls in, the buckets above added to c; -1: none (rounding left
 * the cut past them all: the last bucket of weight then holds it). */
static int32_t cut_digit(CutWalk *c, const int64_t *count, const double *mass, int32_t digits) {
    int32_t last = -1;
    for (int32_t b = digits - 1; b >= 0; b--) {
        if (!count[b]) continue;
        if (passes_cut(c, count[b], mass[b])) return b;
        c->ranked += count[b], c->before += mass[b], last = b;
    }
    if (last >= 0) c->ranked -= count[last], c->before -= mass[last];
    return last;
}

/* The cut among the rank-ordered tokens of its bucket: the last one kept (the row's top one always is). */
static void walk_cut(CutWalk *c, const Ranked *tokens, int64_t n, RowScale *s) {
    for (int64_t i = 0; i < n; i++, c->ranked++) {
        if (c->ranked > 0 && ((c->top_k > 0 && c->ranked >= c->top_k) || c->before >= c->limit)) break;
        s->cut_w = tokens[i].w, s->cut_at = tokens[i].at;
        c->before += tokens[i].w;
    }
}

#define MAX_TOP 64 /* top logprobs a row may ask for (the API allows 20), and top-k found directly */

/* Token `at` (logit v) into the first `*count` of the k best, sorted by logit and then index. */
static void keep_best(Ranked *best, int64_t *count, int64_t k, float v, int64_t at) {
    if (*count == k && !(v > best[k - 1].w)) return;
    int64_t j = *count < k ? (*count)++ : k - 1;
    for (; j > 0 && v > best[j - 1].w; j--) best[j] = best[j - 1];
    best[j] = (Ranked){v, at};
}

#define SCAN 64 /* logits whose largest is compared with the k-th best before any of them is looked at */

/* The k largest logits of the row (k <= MAX_TOP), sorted. */
static int64_t top_logits(const float *x, int64_t vocab, int64_t k, Ranked *best) {
    int64_t count = 0;
    for (int64_t start = 0; start < vocab; start += SCAN) {
        const int64_t n = min64(SCAN, vocab - start);
        if (count == k && !(max_score(x + start, n) > best[k - 1].w)) continue;
        for (int64_t i = 0; i < n; i++) keep_best(best, &count, k, x[start + i], start + i);
    }
    return count;
}

/* The weight of token `at` as block_weights computes it (its block's vector or tail arithmetic), s uncut. */
static float weight_at(const float *x, int64_t vocab, RowScale s, int64_t at) {
    float w[BLOCK] __attribute__((aligned(64)));
    const int64_t start = at / BLOCK * BLOCK;
    block_weights(x + start, min64(BLOCK, vocab - start), s, start, w);
    return w[at - start];
}

/* The cut of a top-k of at most MAX_TOP: the k largest logits found directly (most of the row skipped by a
 * compare of its blocks' largest), their weights, and top_p walked over them; no histogram. */
static void find_top_k_cut(const float *x, int64_t vocab, RowScale *s, CutWalk *c) {
    Ranked best[MAX_TOP];
    const int64_t n = top_logits(x, vocab, c->top_k, best);
    for (int64_t i = 0; i < n; i++) best[i].w = weight_at(x, vocab, *s, best[i].at);
    walk_cut(c, best, n, s);
}

/* s with its cut for top_k (> 0: on) and top_p (< 1: on) of `total` (INFINITY when top_p is off): a top-k up
 * to MAX_TOP directly, else a radix select over the weights' bits, digit by digit, until the bucket holding the
 * cut is small enough to sort (or holds equal weights). 0 on success, -1 without memory. */
static int find_cut(const float *x, int64_t vocab, RowScale *s, int64_t top_k, double top_p, double total) {
    CutWalk c = {top_k, 0, top_p * total, 0.0};
    if (top_k > 0 && top_k <= MAX_TOP) {
        find_top_k_cut(x, vocab, s, &c);
        return 0;
    }
    int64_t *count = malloc(sizeof *count << 12);
    double *mass = malloc(sizeof *mass << 12);
    int status = count && mass ? 0 : -1;
    uint64_t prefix = 0;
    for (int d = 0; !status && d < 3; d++) {
        const int32_t digits = 1 << DIGIT_BITS[d];
        memset(count, 0, sizeof *count * (size_t)digits);
        memset(mass, 0, sizeof *mass * (size_t)digits);
        histogram(x, vocab, *s, prefix, d, count, mass);
        const int32_t b = cut_digit(&c, count, mass, digits);
        if (b < 0) break; /* no cut: every token stays */
        prefix = prefix << DIGIT_BITS[d] | (uint64_t)b;
        if (count[b] > SORT_MAX && d < 2) continue;
        Ranked *tokens = malloc(sizeof *tokens * (size_t)count[b]);
        if (!tokens) status = -1;
        const int64_t n = tokens ? bucket_tokens(x, vocab, *s, prefix, DIGIT_SHIFT[d], d < 2, tokens) : 0;
        walk_cut(&c, tokens, n, s);
        free(tokens);
        break;
    }
    free(count);
    free(mass);
    return status;
}

static int sample_row(const float *x, int64_t vocab, RowScale s, int64_t top_k, double top_p, double u,
                      double *sums, int64_t *out) {
    if (top_k > 0 || top_p < 1.0) { /* the total only for top_p: a pass over the row saved for a top-k alone */
        const double total = top_p < 1.0 ? row_weights(x, vocab, s, sums) : INFINITY;
        const int status = find_cut(x, vocab, &s, top_k, top_p, total);
        if (status) return status;
    }
    *out = draw(x, vocab, s, u, sums);
    return 0;
}

/* logits (rows, vocab) float32; per row: temperature > 0, min_p in [0, 1], top_k (0: off), top_p in (0, 1]
 * (1: off), a uniform in [0, 1) (double); out: the drawn token ids. Returns 0, -1 when scratch memory could not
 * be had, -2 for a vocabulary under 1 or past int32. */
int sample_rows_f32(const float *logits, int64_t rows, int64_t vocab, const float *temperature, const float *min_p,
                    const int64_t *top_k, const float *top_p, const double *uniforms, int64_t *out) {
    if (vocab < 1 || vocab > INT32_MAX) return -2; /* the vector compares count tokens in int32 */
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

/* log(sum(exp(x - top))) over the row: the weights at temperature 1, unfiltered, each block's sum added in
 * double. */
static float log_sum_exp(const float *x, int64_t vocab, float top) {
    const RowScale s = {top, 1.0f, 0.0f, 0.0f, -1};
    float w[BLOCK] __attribute__((aligned(64)));
    double total = 0.0;
    for (int64_t start = 0; start < vocab; start += BLOCK)
        total += block_weights(x + start, min64(BLOCK, vocab - start), s, start, w);
    return (float)log(total);
}

/* logits (rows, vocab); tokens: each row's chosen token; k top logprobs a row (0..MAX_TOP, at most vocab).
 * Out: chosen (rows,) the tokens' log-probabilities; with k > 0, top_ids and top_values (rows, k). Returns 0, -2
 * for a vocabulary under 1 or k out of range, -3 for a token outside the vocabulary. */
int row_logprobs_f32(const float *logits, int64_t rows, int64_t vocab, const int64_t *tokens, int64_t k,
                     float *chosen, int64_t *top_ids, float *top_values) {
    if (vocab < 1 || k < 0 || k > MAX_TOP || k > vocab) return -2;
    for (int64_t r = 0; r < rows; r++)
        if (tokens[r] < 0 || tokens[r] >= vocab) return -3;
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * vocab;
        const float top = max_score(x, vocab), lse = log_sum_exp(x, vocab, top);
        chosen[r] = (x[tokens[r]] - top) - lse;
        Ranked best[MAX_TOP];
        const int64_t found = k ? top_logits(x, vocab, k, best) : 0;
        for (int64_t j = 0; j < found; j++) {
            top_ids[r * k + j] = best[j].at;
            top_values[r * k + j] = (best[j].w - top) - lse;
        }
    }
    return 0;
}
