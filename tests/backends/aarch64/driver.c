/* Runs the NumPy backend's C kernels, cross-built for AArch64, for tests/backends/test_aarch64_kernels.py: the
 * tests run this program under qemu-user (Python cannot load an AArch64 library) and compare what it writes
 * with the same NumPy references as the x86 kernel tests.
 *
 * One call a line on stdin, "<call> <library> <files...> <numbers...>", each array a raw file the test wrote
 * (outputs: files this program writes); for each line, the kernel's return value on stdout. Every library is
 * loaded once, so one run can make all of a test module's calls: each start of the emulator costs a second.
 * A line it cannot read, a file it cannot read or write, a library or symbol it cannot load: a message on
 * stderr and exit status 2.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WORDS 24
#define MAX_LIBRARIES 16

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "aarch64 driver: %s: %s\n", what, detail);
    exit(2);
}

/* The library at `path`, loaded on first use. */
static void *library(const char *path) {
    static char *paths[MAX_LIBRARIES];
    static void *handles[MAX_LIBRARIES];
    int i = 0;
    for (; i < MAX_LIBRARIES && paths[i] != NULL; i++)
        if (strcmp(paths[i], path) == 0) return handles[i];
    if (i == MAX_LIBRARIES) fail("too many libraries", path);
    handles[i] = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handles[i] == NULL) fail("cannot load", dlerror());
    paths[i] = strdup(path);
    return handles[i];
}

static void *symbol(const char *path, const char *name) {
    void *found = dlsym(library(path), name);
    if (found == NULL) fail("no symbol", name);
    return found;
}

/* A whole input file, in memory (malloc: aligned for any of the kernels' element types). */
static void *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) fail("cannot open", path);
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *data = malloc(size > 0 ? (size_t)size : 1);
    if (data == NULL || fread(data, 1, (size_t)size, f) != (size_t)size) fail("cannot read", path);
    fclose(f);
    return data;
}

static void write_file(const char *path, const void *data, int64_t bytes) {
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, (size_t)bytes, f) != (size_t)bytes || fclose(f) != 0) fail("cannot write", path);
}

static int64_t number(const char *word) { return strtoll(word, NULL, 10); }
static float real(const char *word) { return (float)strtod(word, NULL); } /* hexadecimal: exact */

typedef int (*Matmul)(const float *, const uint8_t *, int64_t, int32_t, float *, int64_t, int64_t, int64_t, int);
typedef int (*Dequantize)(const uint8_t *, int64_t, int32_t, float *, int64_t, int64_t);
typedef int (*Decode)(const float *, const void *, const void *, const int32_t *, const int32_t *, float *, int64_t,
                      int64_t, int64_t, int64_t, int64_t, float, int64_t, int64_t, int64_t, int64_t, int64_t);
typedef int (*Chunk)(const float *, const void *, const void *, const int32_t *, int64_t, int64_t, int64_t, int64_t,
                     float *, int64_t, int64_t, int64_t, int64_t, float, int64_t, int64_t, int64_t);
typedef int (*Sample)(const float *, int64_t, int64_t, const float *, const float *, const int64_t *, const float *,
                      const double *, int64_t *);
typedef int (*Logprobs)(const float *, int64_t, int64_t, const int64_t *, int64_t, float *, int64_t *, float *);
typedef int (*Flag)(void);
typedef void (*Convert)(const void *, int64_t, void *);

/* matmul LIB X W OUT row_bytes type m k n fast: out (m, n) float32 = x @ w.T (matmul_weights_f32). */
static int call_matmul(char **a) {
    const int64_t m = number(a[7]), k = number(a[8]), n = number(a[9]);
    float *x = read_file(a[2]), *out = malloc(sizeof(float) * (size_t)(m * n > 0 ? m * n : 1));
    uint8_t *w = read_file(a[3]);
    const int status = ((Matmul)symbol(a[1], "matmul_weights_f32"))(x, w, number(a[5]), (int32_t)number(a[6]), out,
                                                                     m, k, n, (int)number(a[10]));
    write_file(a[4], out, (int64_t)sizeof(float) * m * n);
    free(x), free(w), free(out);
    return status;
}

/* dequantize LIB W OUT row_bytes type n k: out (n, k) float32 (dequantize_f32). */
static int call_dequantize(char **a) {
    const int64_t n = number(a[6]), k = number(a[7]);
    uint8_t *w = read_file(a[2]);
    float *out = malloc(sizeof(float) * (size_t)(n * k > 0 ? n * k : 1));
    const int status = ((Dequantize)symbol(a[1], "dequantize_f32"))(w, number(a[4]), (int32_t)number(a[5]), out, n, k);
    write_file(a[3], out, (int64_t)sizeof(float) * n * k);
    free(w), free(out);
    return status;
}

/* decode LIB Q K V TABLES LENS OUT heads kv_heads head_dim block_size table_stride scale batch parallel_min
 * kv_half window num_blocks: out (batch, heads, head_dim) (decode_attention_f32). */
static int call_decode(char **a) {
    const int64_t heads = number(a[8]), dim = number(a[10]), batch = number(a[14]);
    float *q = read_file(a[2]), *out = malloc(sizeof(float) * (size_t)(batch * heads * dim));
    void *k = read_file(a[3]), *v = read_file(a[4]);
    int32_t *tables = read_file(a[5]), *lens = read_file(a[6]);
    const int status = ((Decode)symbol(a[1], "decode_attention_f32"))(
        q, k, v, tables, lens, out, heads, number(a[9]), dim, number(a[11]), number(a[12]), real(a[13]), batch,
        number(a[15]), number(a[16]), number(a[17]), number(a[18]));
    write_file(a[7], out, (int64_t)sizeof(float) * batch * heads * dim);
    free(q), free(k), free(v), free(tables), free(lens), free(out);
    return status;
}

/* chunk LIB Q K V TABLE OUT table_len num_blocks context n heads kv_heads head_dim block_size scale parallel_min
 * kv_half window: out (n, heads, head_dim) (chunk_attention_f32). */
static int call_chunk(char **a) {
    const int64_t n = number(a[10]), heads = number(a[11]), dim = number(a[13]);
    float *q = read_file(a[2]), *out = malloc(sizeof(float) * (size_t)(n * heads * dim));
    void *k = read_file(a[3]), *v = read_file(a[4]);
    int32_t *table = read_file(a[5]);
    const int status = ((Chunk)symbol(a[1], "chunk_attention_f32"))(
        q, k, v, table, number(a[7]), number(a[8]), number(a[9]), n, out, heads, number(a[12]), dim, number(a[14]),
        real(a[15]), number(a[16]), number(a[17]), number(a[18]));
    write_file(a[6], out, (int64_t)sizeof(float) * n * heads * dim);
    free(q), free(k), free(v), free(table), free(out);
    return status;
}

/* sample LIB LOGITS TEMPERATURE MIN_P TOP_K TOP_P UNIFORMS OUT rows vocab: out (rows,) int64 token ids
 * (sample_rows_f32). */
static int call_sample(char **a) {
    const int64_t rows = number(a[9]), vocab = number(a[10]);
    float *logits = read_file(a[2]), *temperature = read_file(a[3]), *min_p = read_file(a[4]), *top_p = read_file(a[6]);
    int64_t *top_k = read_file(a[5]), *out = malloc(sizeof(int64_t) * (size_t)(rows > 0 ? rows : 1));
    double *uniforms = read_file(a[7]);
    const int status = ((Sample)symbol(a[1], "sample_rows_f32"))(logits, rows, vocab, temperature, min_p, top_k, top_p,
                                                                 uniforms, out);
    write_file(a[8], out, (int64_t)sizeof(int64_t) * rows);
    free(logits), free(temperature), free(min_p), free(top_p), free(top_k), free(uniforms), free(out);
    return status;
}

/* logprobs LIB LOGITS TOKENS OUT rows vocab k: out holds chosen (rows,) float32, then top_ids (rows, k) int64,
 * then top_values (rows, k) float32 (row_logprobs_f32). */
static int call_logprobs(char **a) {
    const int64_t rows = number(a[5]), vocab = number(a[6]), k = number(a[7]);
    float *logits = read_file(a[2]);
    int64_t *tokens = read_file(a[3]);
    const size_t bytes = (size_t)(rows * (4 + 12 * k));
    char *out = malloc(bytes > 0 ? bytes : 1);
    float *chosen = (float *)out, *values = (float *)(out + rows * (4 + 8 * k));
    int64_t *ids = (int64_t *)(out + rows * 4);
    const Logprobs logprobs = (Logprobs)symbol(a[1], "row_logprobs_f32");
    const int status = logprobs(logits, rows, vocab, tokens, k, chosen, ids, values);
    write_file(a[4], out, (int64_t)bytes);
    free(logits), free(tokens), free(out);
    return status;
}

/* probe LIB OUT: what the build runs, as int32s: fast_small_steps, fast_uses_tiles, quant_sums_wide,
 * built_with_openmp. */
static int call_probe(char **a) {
    const char *names[] = {"fast_small_steps", "fast_uses_tiles", "quant_sums_wide", "built_with_openmp"};
    int32_t flags[4];
    for (int i = 0; i < 4; i++) flags[i] = ((Flag)symbol(a[1], names[i]))();
    write_file(a[2], flags, sizeof flags);
    return 0;
}

/* round_to_half / widen_half LIB IN OUT n (half_check.c): n float32 -> float16, or back. */
static int call_convert(char **a, const char *name, int64_t out_bytes) {
    const int64_t n = number(a[4]);
    void *in = read_file(a[2]), *out = malloc((size_t)(n * out_bytes));
    ((Convert)symbol(a[1], name))(in, n, out);
    write_file(a[3], out, n * out_bytes);
    free(in), free(out);
    return 0;
}

/* The call a line names, given enough words for it. */
static int call(char **a, int words) {
    static const struct {
        const char *name;
        int words;
    } calls[] = {{"matmul", 11}, {"dequantize", 8}, {"decode", 19}, {"chunk", 19}, {"probe", 3},
                 {"round_to_half", 5}, {"widen_half", 5}, {"sample", 11}, {"logprobs", 8}};
    int i = 0;
    for (; i < (int)(sizeof calls / sizeof calls[0]); i++)
        if (strcmp(a[0], calls[i].name) == 0) break;
    if (i == (int)(sizeof calls / sizeof calls[0]) || words != calls[i].words) fail("cannot read the call", a[0]);
    switch (i) {
    case 0: return call_matmul(a);
    case 1: return call_dequantize(a);
    case 2: return call_decode(a);
    case 3: return call_chunk(a);
    case 4: return call_probe(a);
    case 5: return call_convert(a, "round_to_half", 2);
    case 6: return call_convert(a, "widen_half", 4);
    case 7: return call_sample(a);
    default: return call_logprobs(a);
    }
}

int main(void) {
    char line[8192];
    while (fgets(line, sizeof line, stdin) != NULL) {
        char *words[MAX_WORDS];
        int count = 0;
        for (char *word = strtok(line, " \n"); word != NULL && count < MAX_WORDS; word = strtok(NULL, " \n"))
            words[count++] = word;
        if (count == 0) continue;
        printf("%d\n", call(words, count));
    }
    return 0;
}
