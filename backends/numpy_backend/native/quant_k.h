/* Q5_0, Q5_1 and the K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K as stored: one block of 32 weights dequantized in registers
 * for quant.h's deq_block (included by quant.h, after deq16), with the arithmetic of the `gguf` package's
 * NumPy `quants.dequantize`, the reference (tests/backends/test_native_quant.py).
 *
 * The layouts (bytes) and each weight as gguf computes it, in float32, every operation rounded:
 *   Q5_0 (22 per 32 weights): d, qh (bit j: weight j's fifth bit), qs (byte j: weight j low nibble, j + 16
 *        high): d * (q - 16).
 *   Q5_1 (24): d, m, qh, qs: d * q + m.
 *   Q4_K (144 per super-block of 256, 8 sub-blocks of 32): d, dmin, 12 bytes of 6-bit scales sc and mins mn
 *        (k_scale_bytes), qs (sub-block 2i: the low nibbles of bytes 32i .. 32i + 31, 2i + 1 their high ones):
 *        (d * sc) * q - (dmin * mn).
 *   Q5_K (176): d, dmin, scales, qh (32: bit s of byte i is weight i of sub-block s's fifth bit), qs as Q4_K.
 *   Q6_K (210): ql (128), qh (64), 16 int8 scales (one per 16 weights), d: (d * scale) * (q - 32), q 6 bits.
 *   Q2_K (84): 16 bytes of scales (one per 16 weights: sc the low nibble, mn the high one), qs (64: weights
 *        32 j + i of each half h (128 weights) are bits 2 j, 2 j + 1 of byte 32 h + i), d, dmin:
 *        (d * sc) * q - (dmin * mn), q 2 bits.
 *   Q3_K (110): hmask (32: bit s of byte i above weight 32 s + i), qs (64, as Q2_K's), 12 bytes of 6-bit
 *        scales (q3_k_scale), d: (d * scale) * q, q = low bits | hmask bit << 2, minus 4 (-4 .. 3).
 * So a block of 32 is a sub-block of its super-block b / 8, and K-quant rows are whole super-blocks.
 *
 * Exactness, for the FMAs below: a float16 d has 11 significant bits, so d * sc and dmin * mn (6-bit integers)
 * and d * scale (|scale| <= 128) are exact in float32 (as gguf computes them: their values are gguf's), and
 * so are (d * sc) * q (17 + 5 bits) and Q5's d * q (11 + 5). A sum x * q + c of an exact product rounds once
 * whether fused or not: one FMA is gguf's two roundings, bit for bit; test_every_half_scale_dequantizes_as_gguf
 * checks it for every float16 d (and dmin, m). Q6_K's (d * scale) * (q - 32) may round (18 + 6 bits): it is
 * one product, as gguf's, fused with nothing.
 *
 * Every tier reads these types through the 8-lane kernels (quant_matmul.h's tiles and strips), the AVX-512
 * ones too, with the AVX2 dequantization below (never quant_wide.h's 16-lane sums, q4_nibbles.h's order nor the
 * fast precision's AMX tiles: eight_lanes_only), so a row's result is the float32 copy's, bit for bit, in any
 * batch. Only the fast precision's steps of 1-3 rows read them otherwise (q8_dots.h, q8_k.h).
 */
#ifndef PAGEDSERVE_QUANT_K_H
#define PAGEDSERVE_QUANT_K_H

#define QK_K 256 /* weights per K-quant super-block: 8 blocks of QBLOCK */
enum { Q5_0_BYTES = 22, Q5_1_BYTES = 24, Q4_K_BYTES = 144, Q5_K_BYTES = 176, Q6_K_BYTES = 210 };
enum { Q2_K_BYTES = 84, Q3_K_BYTES = 110 };

/* The K-quants whose scales a super-block's KScales holds. */
static inline int is_k_quant(int32_t type) {
    return type == WEIGHTS_Q4_K || type == WEIGHTS_Q5_K || type == WEIGHTS_Q6_K;
}

/* Q2_K and Q3_K: their blocks read their own two scales (nothing in KScales, which the other K-quants' tiles
 * keep for every row: 16 more floats a row would grow those tiles' frames), and their loops are instantiated
 * out of line (quant_matmul.h's tile_k23), away from the other types' dispatch. */
static inline int is_k23(int32_t type) { return type == WEIGHTS_Q2_K || type == WEIGHTS_Q3_K; }

/* This header's types but Q2_K / Q3_K: those project_tile_q itself reads (quant_wide_for keeps them off the
 * 16-lane paths there). Q2_K and Q3_K never reach it, and a test for them there changed its code for every type. */
static inline int eight_lanes_tiled(int32_t type) {
    return type == WEIGHTS_Q5_0 || type == WEIGHTS_Q5_1 || is_k_quant(type);
}

/* The types this header reads: only through the 8-lane kernels (and the fast precision's 8-bit small steps). */
static inline int eight_lanes_only(int32_t type) { return eight_lanes_tiled(type) || is_k23(type); }

/* A K-quant super-block's scales, decoded once for its 8 blocks (per block they cost as much as the weights'
 * own arithmetic): Q4_K / Q5_K: d[s] = d * sc and m[s] = dmin * mn of sub-block s; Q6_K: d[i] = d * scale of
 * weights 16 i .. 16 i + 15. The products gguf rounds, exactly (see above). */
typedef struct {
    float d[16], m[8];
} KScales;

/* The 8 6-bit scales and 8 mins of a Q4_K / Q5_K super-block's 12 packed bytes p as bytes (gguf's get_scale_min,
 * four at a time): s < 4: the low 6 bits of bytes s (scale) and s + 4 (min); else byte s + 4's low (scale) or
 * high (min) nibble, with the top 2 bits of byte s - 4 (scale) or s (min) above it. */
static inline void k_scale_bytes(const uint8_t *p, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[3], out[4];
    memcpy(u, p, sizeof u);
    out[0] = u[0] & 0x3f3f3f3fu;
    out[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;
    out[2] = u[1] & 0x3f3f3f3fu;
    out[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;
    memcpy(sc, out, 8), memcpy(mn, out + 2, 8);
}

/* 8 (or 16) integers times f, into out: exact products (a float16 f, integers of 8 bits at most). */
static inline void scaled_bytes(const uint8_t *q, int sign, int count, float f, float *out) {
#if defined(__AVX2__)
    for (int i = 0; i < count; i += 8) {
        const __m128i bytes = _mm_loadl_epi64((const __m128i *)(q + i));
        const __m256i ints = sign ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_set1_ps(f), _mm256_cvtepi32_ps(ints)));
    }
#else
    for (int i = 0; i < count; i++) out[i] = f * (sign ? (float)(int8_t)q[i] : (float)q[i]);
#endif
}

/* Super-block sb's scales; `type` a K-quant, a constant once inlined. */
static inline __attribute__((always_inline)) void k_scales_of(const uint8_t *row, int32_t type, int64_t sb,
                                                              KScales *ks) {
    if (type == WEIGHTS_Q6_K) {
        const uint8_t *super = row + sb * Q6_K_BYTES;
        scaled_bytes(super + 192, 1, 16, half_to_float(load_u16(super + 208)), ks->d);
        return;
    }
    const uint8_t *super = row + sb * (type == WEIGHTS_Q5_K ? Q5_K_BYTES : Q4_K_BYTES);
    uint8_t sc[8], mn[8];
    k_scale_bytes(super + 4, sc, mn);
    scaled_bytes(sc, 0, 8, half_to_float(load_u16(super)), ks->d);
    scaled_bytes(mn, 0, 8, half_to_float(load_u16(super + 2)), ks->m);
}

/* Before block b of a row: its super-block's scales, where b starts one (nothing for the other types). */
static inline __attribute__((always_inline)) void k_scales_at(const uint8_t *row, int32_t type, int64_t b,
                                                              KScales *ks) {
    if (is_k_quant(type) && (b & 7) == 0) k_scales_of(row, type, b >> 3, ks);
}

/* Blocks a loop takes together, unrolled: a K-quant's super-block, so that each block's sub-block (b & 7: its
 * nibble, bit and shifts) is a constant. The five K-quants are ggml's ids 10-14, tested as a range: the same
 * test through is_k_quant and is_k23 changed how GCC compiled the 3-4 row tiles of every other type (a 4-row
 * projection 3-5 % slower on avx2). */
static inline int64_t block_step(int32_t type) { return type >= WEIGHTS_Q2_K && type <= WEIGHTS_Q6_K ? 8 : 1; }

/* A block as integers and their scales, for deq16 (the tiers without AVX2): weights 0-15 are q[0] with d[0] and
 * m[0], 16-31 q[1] with d[1], m[1]; d * q + m rounded twice (DEQ_MIN), or d * q with q as int8 (DEQ_SIGNED). */
typedef struct {
    u8x16 q[2];
    float d[2], m[2];
} QBlock;

static inline int qblock_kind(int32_t type) {
    return type == WEIGHTS_Q5_0 || type == WEIGHTS_Q6_K || type == WEIGHTS_Q3_K ? DEQ_SIGNED : DEQ_MIN;
}

/* 0x10 in lane i of the first (second) vector where bit i (i + 16) of qh is set: Q5's fifth bits, in place. */
static inline void fifth_bits(const uint8_t *qh, u8x16 out[2]) {
    const u8x16 bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    u8x16 spread[2]; /* qh's bytes 0, 1 (2, 3), each in 8 lanes */
#if defined(__SSE2__)
    uint32_t bits;
    memcpy(&bits, qh, sizeof bits);
    __m128i v = _mm_cvtsi32_si128((int)bits);
    v = _mm_unpacklo_epi8(v, v), v = _mm_unpacklo_epi16(v, v); /* each byte 4 times */
    spread[0] = (u8x16)_mm_unpacklo_epi32(v, v), spread[1] = (u8x16)_mm_unpackhi_epi32(v, v);
#else
    const u8x16 v = {qh[0], qh[1], qh[2], qh[3]};
    spread[0] = __builtin_shuffle(v, (u8x16){0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1});
    spread[1] = __builtin_shuffle(v, (u8x16){2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3});
#endif
    for (int h = 0; h < 2; h++) out[h] = (u8x16)((spread[h] & bit) != 0) & 0x10;
}

/* Bits 2t and 2t + 1 of each byte, by constant shifts (a byte shift by a variable is lane by lane on SSE2). */
static inline u8x16 two_bits(u8x16 v, int t) {
    switch (t) {
    case 0: return v & 3;
    case 1: return (v >> 2) & 3;
    case 2: return (v >> 4) & 3;
    default: return v >> 6;
    }
}

static inline __attribute__((always_inline)) QBlock q5_block(const uint8_t *row, int64_t b, int with_min) {
    const uint8_t *block = row + b * (with_min ? Q5_1_BYTES : Q5_0_BYTES), *qh = block + (with_min ? 4 : 2);
    const u8x16 qs = *(const u8x16 *)(qh + 4);
    const float d = half_to_float(load_u16(block)), m = with_min ? half_to_float(load_u16(block + 2)) : 0.0f;
    u8x16 fifth[2];
    fifth_bits(qh, fifth);
    QBlock k = {{(qs & 0x0f) | fifth[0], (qs >> 4) | fifth[1]}, {d, d}, {m, m}};
    if (!with_min) k.q[0] -= 16, k.q[1] -= 16; /* q - 16, read as int8 */
    return k;
}

/* Q4_K, Q5_K (`five`): m = -(dmin * mn), so d * q + m is gguf's d * q - dmin * mn (x - y is x + -y in IEEE). */
static inline __attribute__((always_inline)) QBlock k_block(const uint8_t *row, int64_t b, const KScales *ks,
                                                            int five) {
    const uint8_t *super = row + (b >> 3) * (five ? Q5_K_BYTES : Q4_K_BYTES);
    const int s = (int)(b & 7);
    const float d = ks->d[s], m = -ks->m[s];
    const uint8_t *qs = super + (five ? 48 : 16) + 32 * (s / 2);
    QBlock k = {{*(const u8x16 *)qs, *(const u8x16 *)(qs + 16)}, {d, d}, {m, m}};
    for (int h = 0; h < 2; h++) {
        k.q[h] = s % 2 ? k.q[h] >> 4 : k.q[h] & 0x0f;
        if (five) k.q[h] |= (u8x16)((*(const u8x16 *)(super + 16 + 16 * h) & (uint8_t)(1u << s)) != 0) & 0x10;
    }
    return k;
}

/* Q6_K: sub-block s of the super-block's half s / 4 takes ql's bytes 32 (s % 2) .. + 31 of that half (the high
 * nibbles for s % 4 >= 2) and bits 2 (s % 4) of qh's 32 bytes of that half. */
static inline __attribute__((always_inline)) QBlock q6_k_block(const uint8_t *row, int64_t b, const KScales *ks) {
    const uint8_t *super = row + (b >> 3) * Q6_K_BYTES;
    const int s = (int)(b & 7), t = s % 4;
    const uint8_t *ql = super + 64 * (s / 4) + 32 * (t % 2), *qh = super + 128 + 32 * (s / 4);
    QBlock k = {{{0}, {0}}, {ks->d[2 * s], ks->d[2 * s + 1]}, {0, 0}};
    for (int h = 0; h < 2; h++) {
        const u8x16 low = *(const u8x16 *)(ql + 16 * h);
        k.q[h] = ((t / 2 ? low >> 4 : low & 0x0f) | two_bits(*(const u8x16 *)(qh + 16 * h), t) << 4) - 32;
    }
    return k;
}

/* Q3_K's scale of weights 16 g .. 16 g + 15 from its 12 packed bytes p (gguf's unpacking): the low 4 bits are
 * byte g % 8's low (g < 8) or high nibble, the top 2 bits bits 2 (g / 4), 2 (g / 4) + 1 of byte 8 + g % 4; the
 * 6 bits less 32. */
static inline int q3_k_scale(const uint8_t *p, int g) {
    return ((p[g % 8] >> (4 * (g / 8)) & 15) | (p[8 + g % 4] >> (2 * (g / 4)) & 3) << 4) - 32;
}

/* Where block b's 2-bit integers lie in a Q2_K / Q3_K row: sub-block s = b % 8 takes bits 2 (s % 4) of the
 * 32 bytes of qs for its half of the super-block, s / 4. */
static inline const uint8_t *k23_low_bits(const uint8_t *super, int s, int32_t type) {
    return super + (type == WEIGHTS_Q2_K ? 16 : 32) + 32 * (s / 4);
}

/* Q2_K: m = -(dmin * mn), so d * q + m is gguf's (d * sc) * q - dmin * mn, as k_block's. */
static inline __attribute__((always_inline)) QBlock q2_k_block(const uint8_t *row, int64_t b) {
    const uint8_t *super = row + (b >> 3) * Q2_K_BYTES, *qs = k23_low_bits(super, (int)(b & 7), WEIGHTS_Q2_K);
    const int s = (int)(b & 7);
    const float d = half_to_float(load_u16(super + 80)), dmin = half_to_float(load_u16(super + 82));
    QBlock k;
    for (int h = 0; h < 2; h++) {
        const uint8_t sc = super[2 * s + h];
        k.q[h] = two_bits(*(const u8x16 *)(qs + 16 * h), s % 4);
        k.d[h] = d * (float)(sc & 15), k.m[h] = -(dmin * (float)(sc >> 4));
    }
    return k;
}

/* Q3_K: q - 4 read as int8, the mask's bit s over the two low bits. */
static inline __attribute__((always_inline)) QBlock q3_k_block(const uint8_t *row, int64_t b) {
    const uint8_t *super = row + (b >> 3) * Q3_K_BYTES, *qs = k23_low_bits(super, (int)(b & 7), WEIGHTS_Q3_K);
    const int s = (int)(b & 7);
    const float d = half_to_float(load_u16(super + 108));
    QBlock k;
    for (int h = 0; h < 2; h++) {
        const u8x16 high = (*(const u8x16 *)(super + 16 * h) >> s & 1) << 2;
        k.q[h] = (two_bits(*(const u8x16 *)(qs + 16 * h), s % 4) | high) - 4;
        k.d[h] = d * (float)q3_k_scale(super + 96, 2 * s + h), k.m[h] = 0.0f;
    }
    return k;
}

/* `type` one of this header's, a constant once inlined; ks: the K-quants' super-block scales (k_scales_at). */
static inline __attribute__((always_inline)) QBlock qblock_of(const uint8_t *row, int32_t type, int64_t b,
                                                              const KScales *ks) {
    switch (type) {
    case WEIGHTS_Q5_0: return q5_block(row, b, 0);
    case WEIGHTS_Q5_1: return q5_block(row, b, 1);
    case WEIGHTS_Q4_K: return k_block(row, b, ks, 0);
    case WEIGHTS_Q5_K: return k_block(row, b, ks, 1);
    case WEIGHTS_Q2_K: return q2_k_block(row, b);
    case WEIGHTS_Q3_K: return q3_k_block(row, b);
    default: return q6_k_block(row, b, ks);
    }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* The avx2 tier's (and the AVX-512 tiers'): integers built in vector registers, converted 8 at a time. */

/* The floats of the two float16 values at p, in lanes 0 and 1 (and 0 in 2, 3). */
static inline __m128 two_halves(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, sizeof bits);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)bits));
}

static inline __m256 lane0(__m128 v) { return _mm256_broadcastss_ps(v); }
static inline __m256 lane1(__m128 v) { return _mm256_broadcastss_ps(_mm_movehdup_ps(v)); }

/* 32 bytes as 4 vectors of 8 dwords, zero- or sign-extended, in order. */
static inline __attribute__((always_inline)) void widen32(__m256i bytes, int sign, __m256i out[4]) {
    const __m128i halves[2] = {_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1)};
    for (int h = 0; h < 2; h++) {
        const __m128i up = _mm_srli_si128(halves[h], 8);
        out[2 * h] = sign ? _mm256_cvtepi8_epi32(halves[h]) : _mm256_cvtepu8_epi32(halves[h]);
        out[2 * h + 1] = sign ? _mm256_cvtepi8_epi32(up) : _mm256_cvtepu8_epi32(up);
    }
}

/* Each byte value's 8 bits as 8 dwords, 0x10 where the bit is set: Q5's fifth bits in place, one load for 8
 * weights (by shifts and masks, per-lane shifts of qh, they took 3 of the 6 vector operations per 8 weights). */
#define Q5_BITS(i)                                                                                                  \
    {((i) & 1) << 4, ((i) >> 1 & 1) << 4, ((i) >> 2 & 1) << 4, ((i) >> 3 & 1) << 4, ((i) >> 4 & 1) << 4,           \
     ((i) >> 5 & 1) << 4, ((i) >> 6 & 1) << 4, ((i) >> 7 & 1) << 4}
#define Q5_BITS4(i) Q5_BITS(i), Q5_BITS((i) + 1), Q5_BITS((i) + 2), Q5_BITS((i) + 3)
#define Q5_BITS16(i) Q5_BITS4(i), Q5_BITS4((i) + 4), Q5_BITS4((i) + 8), Q5_BITS4((i) + 12)
#define Q5_BITS64(i) Q5_BITS16(i), Q5_BITS16((i) + 16), Q5_BITS16((i) + 32), Q5_BITS16((i) + 48)
static const uint32_t q5_fifth[256][8] __attribute__((aligned(32))) = {Q5_BITS64(0), Q5_BITS64(64), Q5_BITS64(128),
                                                                       Q5_BITS64(192)};
#undef Q5_BITS64
#undef Q5_BITS16
#undef Q5_BITS4
#undef Q5_BITS

/* Q5_0 / Q5_1: bytes widened by their loads (deq_q4's AVX2 note), weight j's fifth bit (bit j of qh) from
 * q5_fifth. Q5_0: qh inverted, so 16 where the bit is clear, subtracted from the nibble: q - 16 as an exact
 * integer, then d * (q - 16) as gguf (exact, its zero's sign too). Q5_1: d * q + m as one FMA (d * q exact). */
static inline __attribute__((always_inline)) void deq_q5(const uint8_t *row, int64_t b, int with_min, vec8 out[4]) {
    const uint8_t *block = row + b * (with_min ? Q5_1_BYTES : Q5_0_BYTES), *qh = block + (with_min ? 4 : 2);
    const __m128 dm = two_halves(block); /* Q5_0: d, and qh's first two bytes (unused) */
    const __m256 d = lane0(dm), m = lane1(dm);
    const __m256i low = _mm256_set1_epi32(0x0f);
    for (int h = 0; h < 2; h++) {
        const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qh + 4 + 8 * h)));
        const __m256i nibbles[2] = {_mm256_and_si256(bytes, low), _mm256_srli_epi32(bytes, 4)};
        for (int i = 0; i < 2; i++) { /* weights 8 h .. 8 h + 7, then 16 more */
            const uint8_t bits = with_min ? qh[h + 2 * i] : (uint8_t)~qh[h + 2 * i];
            const __m256i fifth = _mm256_load_si256((const __m256i *)q5_fifth[bits]);
            const __m256i q = with_min ? _mm256_or_si256(nibbles[i], fifth) : _mm256_sub_epi32(nibbles[i], fifth);
            out[h + 2 * i] = with_min ? (vec8)_mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), m)
                                      : (vec8)_mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
        }
    }
}

/* Q4_K: bytes widened by their loads, the sub-block's nibble by a shift of 0 or 4; (d * sc) * q - dmin * mn as
 * one FMA ((d * sc) * q exact). */
static inline __attribute__((always_inline)) void deq_q4_k(const uint8_t *row, int64_t b, const KScales *ks,
                                                         vec8 out[4]) {
    const uint8_t *super = row + (b >> 3) * Q4_K_BYTES;
    const int s = (int)(b & 7);
    const __m256 d = _mm256_broadcast_ss(ks->d + s), m = _mm256_broadcast_ss(ks->m + s);
    const uint8_t *q = super + 16 + 32 * (s / 2);
    for (int u = 0; u < 4; u++) {
        const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * u)));
        const __m256i nibbles = s % 2 ? _mm256_srli_epi32(bytes, 4) : _mm256_and_si256(bytes, _mm256_set1_epi32(0x0f));
        out[u] = (vec8)_mm256_fmsub_ps(d, _mm256_cvtepi32_ps(nibbles), m);
    }
}

/* Bit `from` of each byte of v moved to bit `to` by a 16-bit shift (the caller masks what crossed from the
 * neighbouring byte): one immediate shift where the sub-block is a constant (the tiles' unrolled loops). */
static inline __attribute__((always_inline)) __m256i bits_to(__m256i v, int from, int to) {
    return from <= to ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(to - from))
                      : _mm256_srl_epi16(v, _mm_cvtsi32_si128(from - to));
}

/* Q5_K: the 32 nibbles and fifth bits combined as bytes (16-bit shifts, then masks that drop what crossed from
 * the neighbouring byte), then widened; the FMA of Q4_K. */
static inline __attribute__((always_inline)) void deq_q5_k(const uint8_t *row, int64_t b, const KScales *ks,
                                                         vec8 out[4]) {
    const uint8_t *super = row + (b >> 3) * Q5_K_BYTES;
    const int s = (int)(b & 7);
    const __m256 d = _mm256_broadcast_ss(ks->d + s), m = _mm256_broadcast_ss(ks->m + s);
    const __m256i qs = _mm256_loadu_si256((const __m256i *)(super + 48 + 32 * (s / 2)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(super + 16));
    const __m256i nibbles = _mm256_and_si256(s % 2 ? _mm256_srli_epi16(qs, 4) : qs, _mm256_set1_epi8(0x0f));
    const __m256i fifth = _mm256_and_si256(bits_to(qh, s, 4), _mm256_set1_epi8(0x10));
    __m256i q[4];
    widen32(_mm256_or_si256(nibbles, fifth), 0, q);
    for (int u = 0; u < 4; u++) out[u] = (vec8)_mm256_fmsub_ps(d, _mm256_cvtepi32_ps(q[u]), m);
}

/* Q6_K: q - 32 as signed bytes (16-bit shifts and masks as Q5_K), widened; (d * scale) * (q - 32) one product,
 * with the scale of weights 0-15 or 16-31. */
static inline __attribute__((always_inline)) void deq_q6_k(const uint8_t *row, int64_t b, const KScales *ks,
                                                         vec8 out[4]) {
    const uint8_t *super = row + (b >> 3) * Q6_K_BYTES;
    const int s = (int)(b & 7), t = s % 4;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(super + 64 * (s / 4) + 32 * (t % 2)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(super + 128 + 32 * (s / 4)));
    const __m256i low = _mm256_and_si256(t / 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0f));
    const __m256i high = _mm256_and_si256(bits_to(qh, 2 * t, 4), _mm256_set1_epi8(0x30));
    __m256i q[4];
    widen32(_mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32)), 1, q);
    const __m256 d[2] = {_mm256_broadcast_ss(ks->d + 2 * s), _mm256_broadcast_ss(ks->d + 2 * s + 1)};
    for (int u = 0; u < 4; u++) out[u] = (vec8)_mm256_mul_ps(d[u / 2], _mm256_cvtepi32_ps(q[u]));
}
/* Q2_K: each half's d * sc and dmin * mn (exact), then the 2-bit integers widened by their loads and shifted
 * into place; the FMA of Q4_K. */
static inline __attribute__((always_inline)) void deq_q2_k(const uint8_t *row, int64_t b, vec8 out[4]) {
    const uint8_t *super = row + (b >> 3) * Q2_K_BYTES;
    const int s = (int)(b & 7);
    const uint8_t *qs = k23_low_bits(super, s, WEIGHTS_Q2_K);
    const __m128 dm = two_halves(super + 80);
    for (int h = 0; h < 2; h++) {
        const uint8_t sc = super[2 * s + h];
        const __m256 d = _mm256_mul_ps(lane0(dm), _mm256_set1_ps((float)(sc & 15)));
        const __m256 m = _mm256_mul_ps(lane1(dm), _mm256_set1_ps((float)(sc >> 4)));
        for (int u = 2 * h; u < 2 * h + 2; u++) {
            const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * u)));
            const __m256i q = _mm256_and_si256(_mm256_srli_epi32(bytes, 2 * (s % 4)), _mm256_set1_epi32(3));
            out[u] = (vec8)_mm256_fmsub_ps(d, _mm256_cvtepi32_ps(q), m);
        }
    }
}

/* Q3_K: q - 4 as signed bytes (16-bit shifts and masks as Q5_K), widened; (d * scale) * q one product (exact). */
static inline __attribute__((always_inline)) void deq_q3_k(const uint8_t *row, int64_t b, vec8 out[4]) {
    const uint8_t *super = row + (b >> 3) * Q3_K_BYTES;
    const int s = (int)(b & 7);
    const __m256i qs = _mm256_loadu_si256((const __m256i *)k23_low_bits(super, s, WEIGHTS_Q3_K));
    const __m256i hmask = _mm256_loadu_si256((const __m256i *)super);
    const __m256i low = _mm256_and_si256(bits_to(qs, 2 * (s % 4), 0), _mm256_set1_epi8(3));
    const __m256i high = _mm256_and_si256(bits_to(hmask, s, 2), _mm256_set1_epi8(4));
    __m256i q[4];
    widen32(_mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(4)), 1, q);
    const float d = half_to_float(load_u16(super + 108));
    for (int h = 0; h < 2; h++) {
        const __m256 scale = _mm256_set1_ps(d * (float)q3_k_scale(super + 96, 2 * s + h));
        for (int u = 2 * h; u < 2 * h + 2; u++) out[u] = (vec8)_mm256_mul_ps(scale, _mm256_cvtepi32_ps(q[u]));
    }
}
#else
static inline __attribute__((always_inline)) void deq_qblock(QBlock k, int kind, vec8 out[4]) {
    deq16(k.q[0], k.d[0], k.m[0], kind, out);
    deq16(k.q[1], k.d[1], k.m[1], kind, out + 2);
}

static inline __attribute__((always_inline)) void deq_q5(const uint8_t *row, int64_t b, int with_min, vec8 out[4]) {
    deq_qblock(q5_block(row, b, with_min), with_min ? DEQ_MIN : DEQ_SIGNED, out);
}

static inline __attribute__((always_inline)) void deq_q4_k(const uint8_t *row, int64_t b, const KScales *ks,
                                                         vec8 out[4]) {
    deq_qblock(k_block(row, b, ks, 0), DEQ_MIN, out);
}

static inline __attribute__((always_inline)) void deq_q5_k(const uint8_t *row, int64_t b, const KScales *ks,
                                                         vec8 out[4]) {
    deq_qblock(k_block(row, b, ks, 1), DEQ_MIN, out);
}

static inline __attribute__((always_inline)) void deq_q6_k(const uint8_t *row, int64_t b, const KScales *ks,
                                                         vec8 out[4]) {
    deq_qblock(q6_k_block(row, b, ks), DEQ_SIGNED, out);
}

static inline __attribute__((always_inline)) void deq_q2_k(const uint8_t *row, int64_t b, vec8 out[4]) {
    deq_qblock(q2_k_block(row, b), DEQ_MIN, out);
}

static inline __attribute__((always_inline)) void deq_q3_k(const uint8_t *row, int64_t b, vec8 out[4]) {
    deq_qblock(q3_k_block(row, b), DEQ_SIGNED, out);
}
#endif

#endif
