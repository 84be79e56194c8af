/* A whole small step of a decoder on the CPU, every layer in one call, for the NumPy backend.
 *
 * Every token of the step is a row: a decoding sequence's one token, or each token of a short prefill chunk,
 * which attends to the cache up to its own position (the chunk's K and V are all stored before attention, so
 * that is its causal mask). For such a step the per-layer work besides the projections (RMSNorm, RoPE, the KV
 * write, SwiGLU, residual adds) is a few microseconds of arithmetic, but as NumPy calls from Python it cost
 * 4-6 ms a step, and every projection started and stopped the thread team, leaving the memory bus idle
 * between matrices. Here all layers run in one OpenMP parallel region: the threads share out
 * each projection's weight tiles (matmul.h) and the sequences' attention (attention.h), and meet at a barrier
 * between the stages.
 *
 * The layer is what the model's Architecture says (backends/model/architecture.py), passed as data: Llama's
 * (RMSNorm, interleaved RoPE, SwiGLU), or with Gemma 3's pieces, each chosen by the shape or a layer's pointers,
 * never by a family's name: RoPE over head halves and GeGLU (ModelShape), an RMSNorm over each Q and K head and
 * after attention and the MLP (a layer's optional norms), and sliding layers (a layer's window and its choice of
 * the step's two RoPE tables), and Qwen2's biases after the Q, K and V projections (a layer's pointer). Embeddings
 * are scaled before the call, and RoPE's angles (Llama 3's frequency factors included) computed before it.
 *
 * The reference is the NumPy forward (model.DecoderForward with the NumPy kernels); tests compare the logits
 * and the KV cache it writes. Results differ from it only by float32 rounding (summation order, fused
 * multiply-adds, the polynomial exp in SwiGLU's and GeGLU's sigmoids).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "fast_matmul.h"
#include "step_attention.h"
#include "threads.h"

#ifdef _OPENMP
#define NOW() omp_get_wtime()
#else
#include <time.h>
static double NOW(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
#endif

enum { TIME_PROJECTIONS, TIME_ATTENTION, TIME_OTHER, TIME_PARTS }; /* seconds of a step, by stage */

typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, ffn, block_size, num_blocks;
    int64_t window_blocks; /* the blocks of the sliding layers' own pool (StepRows' window_tables); 0: none */
    int64_t kv_half; /* 1: the KV cache holds float16 (rounded to nearest even as stored), 0: float32 */
    int64_t rope_halves; /* RoPE rotates the pairs (i, i + head_dim / 2); 0: the interleaved (2i, 2i + 1) */
    int64_t gelu;        /* the MLP is GeGLU with tanh-approximated GELU; 0: SwiGLU */
    float eps;
} ModelShape;

typedef struct { /* one layer's weights (matrices (out, in) as stored: float32 or a GGUF type) and KV cache */
    const float *attn_norm, *ffn_norm;
    Weights wqkv, wo, w_gate_up, w_down;
    void *keys, *values; /* (num_blocks or window_blocks, block_size, kv_heads, head_dim), float32 or float16 */
    const float *q_norm, *k_norm;                /* (head_dim,): over each Q and K head before RoPE; NULL: none */
    const float *post_attn_norm, *post_ffn_norm; /* (hidden,): on attention's and the MLP's outputs; NULL: none */
    int64_t window;     /* a row at position p attends to p - window + 1 .. p; 0: its whole context */
    int64_t local_rope; /* 1: RoPE by the step's local tables (local_cos, local_sin), 0: by cos, sin */
    const float *qkv_bias; /* (q_size + 2 * kv_size,): added to the Q, K and V projections' output; NULL: none */
} LayerRefs;

typedef struct { /* the step's rows: one per token */
    int64_t rows, table_stride;
    const float *cos, *sin;  /* (rows, head_dim / 2): the RoPE angles of each row's position */
    const int64_t *slots;    /* (rows,) flat KV slot of the token, each distinct; negative: padding */
    const int32_t *block_tables, *context_lens; /* (rows, table_stride): its sequence's table; (rows,): the
                                                   tokens it attends to, itself included (position + 1) */
    const int32_t *seq_first; /* (rows,) the first row of its sequence in the step; NULL: every row its own */
    const float *local_cos, *local_sin; /* as cos, sin at the sliding layers' RoPE base; NULL: no layer uses them */
    /* the sliding layers' own pool, which a layer with a window uses instead of slots and block_tables when given
     * (uses_window_pool): (rows,) slots; (rows, window_stride) tables, -1 for a block wholly before the row's
     * window, never read; NULL, 0: no window pool */
    int64_t window_stride;
    const int64_t *window_slots;
    const int32_t *window_tables;
} StepRows;

typedef struct { /* activations, (rows, width) each; the attention's shared row counter, rows and buffers */
    float *x, *normed, *qkv, *attn, *gate_up, *act;
    int64_t next_row;
    RowGroups groups;
    ChunkWork chunks;
} Activations;

/* Adds the time since the last mark to seconds[part]; only thread 0 keeps time (after a stage's barrier, so
 * the stage is over on every thread). */
typedef struct {
    double *seconds, last;
} StageClock;

static void clock_mark(StageClock *clock, int part) {
    if (THREAD_ID != 0) return;
    const double now = NOW();
    clock->seconds[part] += now - clock->last;
    clock->last = now;
}

/* out (n floats; may be x) = x / sqrt(mean(x^2) + eps) * weight. */
static inline void rms_norm_vector(const float *x, const float *weight, float *out, int64_t n, float eps) {
    vec8 squares = {0};
    for (int64_t i = 0; i < n; i += LANES) squares += *(const vec8 *)(x + i) * *(const vec8 *)(x + i);
    const float denom = sqrtf(hsum(squares) / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] / denom * weight[i];
}

/* out = x / sqrt(mean(x^2) + eps) * weight, row by row. */
static void rms_norm_rows(const float *x, const float *weight, float *out, int64_t rows, int64_t n, float eps) {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) rms_norm_vector(x + r * n, weight, out + r * n, n, eps);
}

/* x += rms_norm(y) row by row, y normed in place: a sandwich norm before its residual add. */
static void add_normed_rows(float *y, const float *weight, float *x, int64_t rows, int64_t n, float eps) {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        rms_norm_vector(y + r * n, weight, y + r * n, n, eps);
        for (int64_t i = 0; i < n; i++) x[r * n + i] += y[r * n + i];
    }
}

/* Rotate `heads` heads of a row in place by one position's angles; pairs are interleaved (2i, 2i+1), or with
 * `halves` the two halves of each head (i, i + head_dim / 2). */
static void rotate_heads(float *v, int64_t heads, int64_t head_dim, const float *cos, const float *sin,
                         int64_t halves) {
    const int64_t half = head_dim / 2, step = halves ? 1 : 2, other = halves ? half : 1;
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < half; i++) {
            float *first = v + h * head_dim + step * i, *second = first + other;
            const float a = *first, b = *second;
            *first = a * cos[i] - b * sin[i];
            *second = a * sin[i] + b * cos[i];
        }
}

/* The RMSNorm of each of `heads` heads of a row, in place (QK norm). */
static void norm_heads(float *v, int64_t heads, int64_t head_dim, const float *weight, float eps) {
    for (int64_t h = 0; h < heads; h++) rms_norm_vector(v + h * head_dim, weight, v + h * head_dim, head_dim, eps);
}

/* 1 when the layer's K/V live in the window pool: a sliding layer, in a step that brings the pool's tables. */
static int uses_window_pool(const LayerRefs *layer, const StepRows *s) {
    return layer->window > 0 && s->window_tables != NULL;
}

/* n floats x stored at value `at` of a cache layer: copied, or rounded to float16 (half). */
static void store_cached(void *layer, int64_t at, const float *x, int64_t n, int64_t half) {
    if (half) store_f16(x, n, (uint8_t *)layer + 2 * at);
    else __builtin_memcpy((float *)layer + at, x, sizeof(float) * (size_t)n);
}

/* The QKV biases on each row, the QK norms and RoPE on its Q and K, then its K and V stored at the row's slot
 * (before attention, which reads it). */
static void rope_and_store_rows(const ModelShape *m, const LayerRefs *layer, const StepRows *s, float *qkv) {
    const int64_t q_size = m->heads * m->head_dim, kv_size = m->kv_heads * m->head_dim;
    const int64_t width = q_size + 2 * kv_size, half = m->head_dim / 2;
    const float *cos = layer->local_rope ? s->local_cos : s->cos, *sin = layer->local_rope ? s->local_sin : s->sin;
    const int64_t *slots = uses_window_pool(layer, s) ? s->window_slots : s->slots;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < s->rows; r++) {
        float *row = qkv + r * width;
        if (layer->qkv_bias != NULL)
            for (int64_t i = 0; i < width; i++) row[i] += layer->qkv_bias[i];
        if (layer->q_norm != NULL) norm_heads(row, m->heads, m->head_dim, layer->q_norm, m->eps);
        if (layer->k_norm != NULL) norm_heads(row + q_size, m->kv_heads, m->head_dim, layer->k_norm, m->eps);
        rotate_heads(row, m->heads + m->kv_heads, m->head_dim, cos + r * half, sin + r * half, m->rope_halves);
        if (slots[r] < 0) continue;
        store_cached(layer->keys, slots[r] * kv_size, row + q_size, kv_size, m->kv_half);
        store_cached(layer->values, slots[r] * kv_size, row + q_size + kv_size, kv_size, m->kv_half);
    }
}

static DecodeShape attention_shape(const ModelShape *m, int64_t table_stride, int64_t window) {
    return (DecodeShape){m->heads, m->kv_heads, m->head_dim, m->block_size, table_stride,
                         1.0f / sqrtf((float)m->head_dim), 0, 0, m->kv_half != 0, window, 0};
}

/* Each row's attention over its sequence's paged context, or the layer's window of it (step_attention.h). */
static void attend_rows(const ModelShape *m, const LayerRefs *layer, const StepRows *s, Activations *a,
                        Scratch *scratch) {
    const int window_pool = uses_window_pool(layer, s);
    const DecodeShape shape = attention_shape(m, window_pool ? s->window_stride : s->table_stride, layer->window);
    const int64_t width = (m->heads + 2 * m->kv_heads) * m->head_dim;
    attend_step(&shape, layer->keys, layer->values, window_pool ? s->window_tables : s->block_tables,
                s->context_lens, a->qkv, width, a->attn, &a->groups, &a->chunks, scratch, &a->next_row);
}

/* sigmoid(z), taking exp of -|z| only (exp_nonpositive): 1 / (1 + e) for z >= 0, e / (1 + e) below. */
static inline vec8 sigmoid8(vec8 z) {
    const vec8 negative = __builtin_convertvector(-(z < 0), vec8); /* 1.0 where z < 0 */
    const vec8 e = exp_nonpositive(z * (1.0f - 2.0f * negative) * -1.0f);
    return (1.0f + (e - 1.0f) * negative) / (1.0f + e);
}

/* The gated MLP's activation: act = f(gate) * up, with gate and up the two halves of each gate_up row; f is SiLU
 * (SwiGLU), g * sigmoid(g), or with `gelu` tanh-approximated GELU (GeGLU), 0.5 g (1 + tanh(y)) with y =
 * sqrt(2 / pi) (g + 0.044715 g^3), computed as g * sigmoid(2y), the same function without tanh's cancellation
 * near -1. */
static void gated_rows(const float *gate_up, float *act, int64_t rows, int64_t ffn, int64_t gelu) {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < ffn; i += LANES) {
            const vec8 g = *(const vec8 *)(gate_up + r * 2 * ffn + i), up = *(const vec8 *)(gate_up + r * 2 * ffn + ffn + i);
            const vec8 z = gelu ? 1.59576912f * (g + 0.044715f * g * g * g) : g; /* 2 sqrt(2 / pi) */
            *(vec8 *)(act + r * ffn + i) = g * sigmoid8(z) * up;
        }
}

/* y (+)= x @ w.T in the step's precision (fast_matmul.h's project_step). */
static void project(const float *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n, int add,
                    ProjectionWork *work) {
    project_step(x, w, y, m, k, n, add, work, THREAD_ID);
}

/* y = x @ w.T, then x += rms_norm(y) by a sandwich norm where there is one (into the free buffer `spare`); else
 * x += x @ w.T directly. */
static void project_residual(const float *in, const Weights *w, const float *post_norm, float *x, float *spare,
                             int64_t rows, int64_t k, int64_t n, float eps, StageClock *clock, ProjectionWork *fast) {
    project_step(in, w, post_norm != NULL ? spare : x, rows, k, n, post_norm == NULL, fast, THREAD_ID);
    clock_mark(clock, TIME_PROJECTIONS);
    if (post_norm == NULL) return;
    add_normed_rows(spare, post_norm, x, rows, n, eps);
    clock_mark(clock, TIME_OTHER);
}

/* One decoder layer for every row: x += post(attention(norm(x))); x += post(mlp(norm(x))). */
static void decoder_layer(const ModelShape *m, const LayerRefs *layer, const StepRows *s, Activations *a,
                          Scratch *scratch, StageClock *clock, ProjectionWork *fast) {
    const int64_t rows = s->rows, hidden = m->hidden, q_size = m->heads * m->head_dim;
    const int64_t qkv_width = q_size + 2 * m->kv_heads * m->head_dim;
    rms_norm_rows(a->x, layer->attn_norm, a->normed, rows, hidden, m->eps);
    clock_mark(clock, TIME_OTHER);
    project(a->normed, &layer->wqkv, a->qkv, rows, hidden, qkv_width, 0, fast);
    clock_mark(clock, TIME_PROJECTIONS);
    rope_and_store_rows(m, layer, s, a->qkv);
    clock_mark(clock, TIME_OTHER);
    attend_rows(m, layer, s, a, scratch);
    clock_mark(clock, TIME_ATTENTION);
    /* normed is free from here until the next norm: the sandwich norms' buffer */
    project_residual(a->attn, &layer->wo, layer->post_attn_norm, a->x, a->normed, rows, q_size, hidden, m->eps, clock,
                     fast);
    rms_norm_rows(a->x, layer->ffn_norm, a->normed, rows, hidden, m->eps);
    clock_mark(clock, TIME_OTHER);
    project(a->normed, &layer->w_gate_up, a->gate_up, rows, hidden, 2 * m->ffn, 0, fast);
    clock_mark(clock, TIME_PROJECTIONS);
    gated_rows(a->gate_up, a->act, rows, m->ffn, m->gelu);
    clock_mark(clock, TIME_OTHER);
    project_residual(a->act, &layer->w_down, layer->post_ffn_norm, a->x, a->normed, rows, m->ffn, hidden, m->eps,
                     clock, fast);
}

/* 0, or -5 when a new token's slot or a block the attention would read lies outside its pool: in the full pool,
 * every block up to the context, where a layer uses it; in the window pool, those from the widest window's first
 * position on (the ones before it may be -1). */
static int check_cache_refs(const ModelShape *m, const LayerRefs *layers, const StepRows *s) {
    int64_t full = 0, window = 0;
    for (int64_t l = 0; l < m->layers; l++)
        if (!uses_window_pool(&layers[l], s)) full = 1;
        else if (layers[l].window > window) window = layers[l].window;
    for (int64_t r = 0; r < s->rows; r++) {
        const int64_t ctx = s->context_lens[r];
        if (full && (s->slots[r] >= m->num_blocks * m->block_size
                     || !table_in_cache(s->block_tables + r * s->table_stride, 0, ctx, m->block_size, m->num_blocks)))
            return -5;
        if (window && (s->window_slots[r] >= m->window_blocks * m->block_size
                       || !table_in_cache(s->window_tables + r * s->window_stride, window_first(ctx - 1, window), ctx,
                                          m->block_size, m->window_blocks)))
            return -5;
    }
    return 0;
}

/* -2 unless every width is a multiple of 8, the heads group evenly (at most 16 query heads per kv head), every
 * matrix is of a type the projections read with its width, and every layer's window and RoPE tables exist, and
 * any window tables come with their slots and pool. */
static int check_shape(const ModelShape *m, const LayerRefs *layers, const StepRows *s) {
    const int ok = m->head_dim % LANES == 0 && m->hidden % LANES == 0 && m->ffn % LANES == 0 && m->kv_heads > 0
                   && m->heads % m->kv_heads == 0 && m->heads / m->kv_heads <= MAX_GROUP && m->block_size > 0;
    if (s->window_tables != NULL && (s->window_slots == NULL || m->window_blocks <= 0)) return -2;
    for (int64_t l = 0; ok && l < m->layers; l++)
        if (layers[l].window < 0 || (layers[l].local_rope && (s->local_cos == NULL || s->local_sin == NULL)))
            return -2;
    for (int64_t l = 0; ok && l < m->layers; l++)
        if (!weights_supported(layers[l].wqkv.type, m->hidden) || !weights_supported(layers[l].wo.type, m->heads * m->head_dim)
            || !weights_supported(layers[l].w_gate_up.type, m->hidden) || !weights_supported(layers[l].w_down.type, m->ffn))
            return -2;
    return ok ? 0 : -2;
}

/* 1 when a layer holds a matrix regrouped for the fast precision's kernel (q8_grouped.h), which no other reads. */
static int any_grouped(const ModelShape *m, const LayerRefs *layers) {
    for (int64_t l = 0; l < m->layers; l++)
        if (is_grouped(layers[l].wqkv.type) || is_grouped(layers[l].wo.type) || is_grouped(layers[l].w_gate_up.type)
            || is_grouped(layers[l].w_down.type))
            return 1;
    return 0;
}

static float *alloc_activations(Activations *a, const ModelShape *m, int64_t rows) {
    const int64_t q_size = m->heads * m->head_dim, qkv = q_size + 2 * m->kv_heads * m->head_dim;
    const size_t floats = (size_t)(rows * (m->hidden + qkv + q_size + 3 * m->ffn));
    float *block = malloc(sizeof(float) * floats + 1);
    if (block == NULL) return NULL;
    a->normed = block;
    a->qkv = a->normed + rows * m->hidden;
    a->attn = a->qkv + rows * qkv;
    a->gate_up = a->attn + rows * q_size;
    a->act = a->gate_up + rows * 2 * m->ffn;
    return block;
}

/* Per-thread attention scratch for every thread the parallel region may start; NULL if out of memory. */
static Scratch *alloc_scratch(const ModelShape *m, int64_t max_ctx, int threads) {
    Scratch *all = calloc((size_t)threads, sizeof(Scratch));
    for (int t = 0; all != NULL && t < threads; t++)
        if (!scratch_alloc(&all[t], m->heads, m->head_dim, max_ctx)) {
            for (int u = 0; u <= t; u++) scratch_free(&all[u]);
            free(all);
            all = NULL;
        }
    return all;
}

static int64_t widest_input(const ModelShape *m) {
    const int64_t q_size = m->heads * m->head_dim, wider = m->hidden > q_size ? m->hidden : q_size;
    return wider > m->ffn ? wider : m->ffn;
}

/* x: (rows, hidden), the rows' token embeddings in, their final hidden states (before the final norm) out;
 * the new K and V of every layer are written to their slots; the rows of one sequence's chunk (seq_first) attend
 * together. `fast`: the projections in the fast precision (fast_matmul.h), else exact. seconds[TIME_PARTS] gets
 * the time spent in the projections, the attention and the rest (overwritten). Returns 0; -1 out of memory; -2
 * unsupported shape; -3 a context length outside 1..table_stride * block_size (or window_stride * block_size);
 * -5 a slot or block outside the cache. */
int fused_step_f32(const ModelShape *m, const LayerRefs *layers, const StepRows *s, float *x, double *seconds,
                   int fast) {
    int64_t total;
    for (int part = 0; part < TIME_PARTS; part++) seconds[part] = 0.0;
    if (check_shape(m, layers, s) != 0 || (!fast && any_grouped(m, layers))) return -2;
    const int64_t max_ctx = max_context(s->context_lens, s->rows, s->table_stride * m->block_size, &total);
    if (max_ctx < 0) return (int)max_ctx;
    if (s->window_tables != NULL && max_ctx > s->window_stride * m->block_size) return -3;
    if (check_cache_refs(m, layers, s) != 0) return -5;
    Activations a = {.x = x};
    float *buffers = alloc_activations(&a, m, s->rows);
    const int threads = MAX_THREADS;
    ProjectionWork work;
    const int have_work = projection_work_alloc(&work, s->rows, widest_input(m), threads, fast);
    const int have_groups = have_work && group_rows(s->seq_first, s->context_lens, s->rows, &a.groups);
    const DecodeShape shape = attention_shape(m, s->table_stride, 0); /* whole contexts' buffers serve any window */
    const int have_chunks = have_groups && chunk_work_alloc(&a.chunks, &shape, a.groups.chunk_context, threads);
    Scratch *scratch = buffers && have_chunks ? alloc_scratch(m, max_ctx, threads) : NULL;
    StageClock clock = {seconds, NOW()};
    if (scratch != NULL) {
#pragma omp parallel num_threads(threads)
        for (int64_t l = 0; l < m->layers; l++)
            decoder_layer(m, &layers[l], s, &a, &scratch[THREAD_ID], &clock, &work);
        for (int t = 0; t < threads; t++) scratch_free(&scratch[t]);
    }
    chunk_work_free(&a.chunks);
    row_groups_free(&a.groups);
    projection_work_free(&work);
    free(scratch);
    free(buffers);
    return scratch != NULL ? 0 : -1;
}

