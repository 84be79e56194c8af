/* A fused step's attention: each prefill chunk (a run of one sequence's rows) by chunk_attention.h, every other
 * row by the decode kernel (attention.h).
 *
 * Run through the decode kernel, each row of a chunk read its sequence's whole context again: a 48-token chunk
 * read it 48 times. The chunk kernel gathers the context once per kv head and takes 16 query tokens at a time as
 * two small matmuls. Both give a token the attention the NumPy reference computes, to float32 rounding.
 */
#ifndef PAGEDSERVE_STEP_ATTENTION_H
#define PAGEDSERVE_STEP_ATTENTION_H

#include <stdint.h>
#include <stdlib.h>

#include "chunk_attention.h"
#include "threads.h"

typedef struct { /* the step's rows by how they attend */
    int64_t *first, *len, chunks; /* each chunk's first row and row count (at least 2) */
    int64_t *singles, num_singles; /* the rows attended one by one */
    int64_t chunk_context; /* the longest context a chunk attends to (0: no chunk) */
} RowGroups;

/* 1 when row r continues the chunk of row r - 1: the same sequence, the next position. */
static int continues_chunk(const int32_t *seq_first, const int32_t *context_lens, int64_t r) {
    return seq_first != NULL && r > 0 && seq_first[r] == seq_first[r - 1] && context_lens[r] == context_lens[r - 1] + 1;
}

/* The rows' groups; seq_first[r]: the first row of row r's sequence (NULL: every row on its own). 0 when out of
 * memory (row_groups_free is still safe). */
static int group_rows(const int32_t *seq_first, const int32_t *context_lens, int64_t rows, RowGroups *g) {
    *g = (RowGroups){malloc(sizeof(int64_t) * (size_t)(3 * rows + 1)), NULL, 0, NULL, 0, 0};
    if (g->first == NULL) return 0;
    g->len = g->first + rows, g->singles = g->len + rows;
    for (int64_t r = 0, end; r < rows; r = end) {
        for (end = r + 1; end < rows && continues_chunk(seq_first, context_lens, end); end++) {}
        if (end - r == 1) {
            g->singles[g->num_singles++] = r;
            continue;
        }
        g->first[g->chunks] = r, g->len[g->chunks++] = end - r;
        g->chunk_context = context_lens[end - 1] > g->chunk_context ? context_lens[end - 1] : g->chunk_context;
    }
    return 1;
}

static void row_groups_free(RowGroups *g) { free(g->first); }

typedef struct { /* the chunks' buffers: the gathered keys and values (shared), each thread's tile scratch */
    float *kv;
    ChunkScratch *scratch;
    int threads;
} ChunkWork;

static ChunkShape chunk_shape(const DecodeShape *s, int64_t n, int64_t context, int64_t q_stride) {
    return chunk_geometry(n, context, s->heads, s->kv_heads, s->head_dim, s->scale, q_stride, s->kv_half, s->window);
}

/* Buffers for chunks attending to up to `context` positions (none when 0), through any window. 0 when out of
 * memory. */
static int chunk_work_alloc(ChunkWork *w, const DecodeShape *s, int64_t context, int threads) {
    *w = (ChunkWork){NULL, NULL, 0};
    if (context == 0) return 1;
    const ChunkShape widest = chunk_geometry(1, context, s->heads, s->kv_heads, s->head_dim, s->scale, 0, s->kv_half, 0);
    w->kv = malloc(sizeof(float) * (size_t)(2 * s->kv_heads * widest.padded * s->head_dim));
    w->scratch = calloc((size_t)threads, sizeof(ChunkScratch));
    for (; w->kv != NULL && w->scratch != NULL && w->threads < threads; w->threads++)
        if (!chunk_scratch_alloc(&w->scratch[w->threads], &widest)) return 0;
    return w->kv != NULL && w->scratch != NULL;
}

static void chunk_work_free(ChunkWork *w) {
    for (int t = 0; t < w->threads; t++) free(w->scratch[t].q);
    free(w->scratch), free(w->kv);
}

/* One chunk (rows first .. first + n - 1, the last n positions of its context) by every thread of the region:
 * the gather, then its (kv head, tile) items; both end at a barrier. */
static void attend_chunk(const DecodeShape *s, const void *k_layer, const void *v_layer, const int32_t *tables,
                         const int32_t *lens, const float *qkv, int64_t width, float *out, int64_t first, int64_t n,
                         ChunkWork *w) {
    const ChunkShape c = chunk_shape(s, n, lens[first + n - 1], width);
    float *keys = w->kv, *values = w->kv + s->kv_heads * c.padded * s->head_dim;
    gather_kv(&c, k_layer, v_layer, tables + first * s->table_stride, s->block_size, keys, values);
    const int64_t items = s->kv_heads * ((n + CHUNK_TILE - 1) / CHUNK_TILE);
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < items; item++)
        chunk_tile(&c, qkv + first * width, item % s->kv_heads, item / s->kv_heads, keys, values,
                   out + first * s->heads * s->head_dim, &w->scratch[THREAD_ID]);
}

/* Every row's attention, by every thread of the enclosing region: rows of queries at qkv (width floats apart),
 * outputs at out (heads * head_dim apart). The single rows are claimed one by one from `counter`. */
static void attend_step(const DecodeShape *s, const void *k_layer, const void *v_layer, const int32_t *tables,
                        const int32_t *lens, const float *qkv, int64_t width, float *out, const RowGroups *g,
                        ChunkWork *chunks, Scratch *scratch, int64_t *counter) {
    for (int64_t i = 0; i < g->chunks; i++)
        attend_chunk(s, k_layer, v_layer, tables, lens, qkv, width, out, g->first[i], g->len[i], chunks);
    if (g->num_singles == 0) return; /* the same on every thread */
#pragma omp single
    *counter = 0; /* the single's barrier publishes it before any thread claims a row */
    const int64_t split = attention_split(g->num_singles, MAX_THREADS, s->kv_heads);
    attend_claimed(s, qkv, width, k_layer, v_layer, tables, lens, out, s->heads * s->head_dim, g->num_singles,
                   g->singles, split, counter, scratch);
#pragma omp barrier
}

#endif
