/* Token sampling over whole rows of logits: temperature, min_p, and one inverse-CDF draw per row from the row's
 * own uniform number. The NumPy reference (backends/sampling.py) builds a probability array and a float64
 * cumulative sum of it, about 2 ms a row for Gemma's 262,144 tokens; here nothing of the row's size is written.
 *
 * A row's weights are w_i = exp((x_i - max) / T), and 0 where w_i < min_p (min_p of the largest probability: the
 * largest weight is exp(0) = 1) or where the argument is below -87 (a -inf logit: a token a grammar or a
 * suppression forbids is never drawn). A first pass sums them per block of BLOCK; the draw is the first token
 * whose running sum (the blocks' sums before its block, then its block's weights one by one, in double) passes
 * u * total. Only the blocks the scan reaches are computed again, on the same boundaries, so it sees the very
 * weights the sums came from. A token of weight 0 never passes the target, so a filtered token is never drawn.
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
} RowScale;

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static inline float scalar_weight(float x, RowScale s) {
    const float arg = (x - s.top) * s.inv_t;
    const float e = arg >= EXP_FLOOR ? expf(arg) : 0.0f; /* NaN compares false: weight 0 */
    return e >= s.min_p ? e : 0.0f;
}

/* The weights of x[0..n), n <= BLOCK, into w; returns their sum. */
static float block_weights(const float *x, int64_t n, RowScale s, float *w) {
    vec8 sums = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        const vec8 arg = (*(const vec8 *)(x + i) - s.top) * s.inv_t;
        const vec8 e = exp_nonpositive(arg);
        const vec8i keep = (arg >= EXP_FLOOR) & (e >= s.min_p);
        const vec8 kept = (vec8)((vec8i)e & keep);
        *(vec8 *)(w + i) = kept;
        sums += kept;
    }
    float tail = 0.0f;
    for (; i < n; i++) tail += w[i] = scalar_weight(x[i], s);
    return hsum(sums) + tail;
}

/* The first token whose running sum passes target, starting at block b with `before` summed ahead of it.
 * Rounding may carry the scan past the block its sums pointed to; past the end: the last token of weight. */
static int64_t scan_from(const float *x, int64_t vocab, RowScale s, int64_t b, double before, double target) {
    float w[BLOCK] __attribute__((aligned(64)));
    int64_t last = -1;
    for (int64_t start = b * BLOCK; start < vocab; start += BLOCK) {
        const int64_t n = min64(BLOCK, vocab - start);
        block_weights(x + start, n, s, w);
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

static int64_t sample_row(const float *x, int64_t vocab, RowScale s, double u, double *sums) {
    const int64_t blocks = (vocab + BLOCK - 1) / BLOCK;
    float w[BLOCK] __attribute__((aligned(64)));
    double total = 0.0;
    for (int64_t b = 0; b < blocks; b++) total += sums[b] = block_weights(x + b * BLOCK, min64(BLOCK, vocab - b * BLOCK), s, w);
    const double target = u * total;
    double before = 0.0;
    int64_t b = 0;
    while (b + 1 < blocks && before + sums[b] <= target) before += sums[b++];
    const int64_t token = scan_from(x, vocab, s, b, before, target);
    return token >= 0 ? token : first_top(x, vocab, s.top);
}

/* logits (rows, vocab) float32; temperature > 0 and min_p in [0, 1] per row; uniforms in [0, 1) per row (double);
 * out: the drawn token ids. Returns 0, -1 when scratch memory could not be had, -2 for a vocabulary under 1. */
int sample_rows_f32(const float *logits, int64_t rows, int64_t vocab, const float *temperature, const float *min_p,
                    const double *uniforms, int64_t *out) {
    if (vocab < 1) return -2;
    int status = 0;
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * vocab;
        double *sums = malloc(sizeof(double) * (size_t)((vocab + BLOCK - 1) / BLOCK));
        if (!sums) {
#pragma omp atomic write
            status = -1;
            continue;
        }
        const RowScale s = {max_score(x, vocab), 1.0f / temperature[r], min_p[r]};
        out[r] = sample_row(x, vocab, s, uniforms[r], sums);
        free(sums);
    }
    return status;
}
