/* Q5_0, Q5_1 and the K-quants Q4_K, Q5_K and Q6_K as stored: one block of 32 weights dequantized in registers
 * for quant.h's deq_block (included by quant.h, after deq16), with the arithmetic of the `gguf` package's
 * NumPy `quants.dequantize`, the reference (tests/backends/test_native_quant.py).
 *
 * The layouts (bytes) and each weight as gguf computes it, in float32, every operation rounded:
 *   Q5_0 (22 per 32 weights): d, qh (bit j: weight j's fifth bit), qs (byte j: weight j low nibble, j + 16
 *        high): d * (q - 16).
 *   Q5_1 (24): d, m, qh, qs: d * q + m.
 *   Q4_K (144 per super-block of 256, 8 sub-blocks of 32): d, dmin, 12 bytes of 6-bit scales sc and mins mn
 *        (k_scale_min), qs (sub-block 2i: the low nibbles of bytes 32i .. 32i + 31, 2i + 1 their high ones):
 *        (d * sc) * q - (dmin * mn).
 *   Q5_K (176): d, dmin, scales, qh (32: bit s of byte i is weight i of sub-block s's fifth bit), qs as Q4_K.
 *   Q6_K (210): ql (128), qh (64), 16 int8 scales (one per 16 weights), d: (d * scale) * (q - 32), q 6 bits.
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
 * fast precision's AMX tiles or 8-bit steps: eight_lanes_only), so a row's result is the float32 copy's, bit for
 * bit, in any batch.
 */
#ifndef PAGEDSERVE_QUANT_K_H
#define PAGEDSERVE_QUANT_K_H

#define QK_K 256 /* weights per K-quant super-block: 8 blocks of QBLOCK */
enum { Q5_0_BYTES = 22, Q5_1_BYTES = 24, Q4_K_BYTES = 144, Q5_K_BYTES = 176, Q6_K_BYTES = 210 };

static inline int is_k_quant(int32_t type) {
    return type == WEIGHTS_Q4_K || type == WEIGHTS_Q5_K || type == WEIGHTS_Q6_K;
}

/* The types this header reads: only through the 8-lane kernels, exact in either precision. */
static inline int eight_lanes_only(int32_t type) {
    return type == WEIGHTS_Q5_0 || type == WEIGHTS_Q5_1 || is_k_quant(type);
}

/* Sub-block s's 6-bit scale and min from a Q4_K / Q5_K super-block's 12 packed bytes p (gguf's get_scale_min):
 * s < 4: the low 6 bits of bytes s and s + 4; else byte s + 4's low (scale) or high (min) nibble, with the top 2
 * bits of byte s - 4 (scale) or s (min) above it. */
static inline void k_scale_min(const uint8_t *p, int s, int *sc, int *mn) {
    if (s < 4) {
        *sc = p[s] & 63, *mn = p[s + 4] & 63;
    } else {
        *sc = (p[s + 4] & 0x0f) | (p[s - 4] >> 6) << 4;
        *mn = (p[s + 4] >> 4) | (p[s] >> 6) << 4;
    }
}

/* A block as integers and their scales, for deq16 (the tiers without AVX2): weights 0-15 are q[0] with d[0] and
 * m[0], 16-31 q[1] with d[1], m[1]; d * q + m rounded twice (DEQ_MIN), or d * q with q as int8 (DEQ_SIGNED). */
typedef struct {
    u8x16 q[2];
    float d[2], m[2];
} QBlock;

static inline int qblock_kind(int32_t type) {
    return type == WEIGHTS_Q5_0 || type == WEIGHTS_Q6_K ? DEQ_SIGNED : DEQ_MIN;
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
static inline __attribute__((always_inline)) QBlock k_block(const uint8_t *row, int64_t b, int five) {
    const uint8_t *super = row + b / 8 * (five ? Q5_K_BYTES : Q4_K_BYTES);
    const int s = (int)(b % 8);
    int sc, mn;
    k_scale_min(super + 4, s, &sc, &mn);
    const float d = half_to_float(load_u16(super)) * (float)sc, m = -(half_to_float(load_u16(super + 2)) * (float)mn);
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
static inline __attribute__((always_inline)) QBlock q6_k_block(const uint8_t *row, int64_t b) {
    const uint8_t *super = row + b / 8 * Q6_K_BYTES;
    const int s = (int)(b % 8), t = s % 4;
    const uint8_t *ql = super + 64 * (s / 4) + 32 * (t % 2), *qh = super + 128 + 32 * (s / 4);
    const float d = half_to_float(load_u16(super + 208));
    QBlock k = {{{0}, {0}}, {d * (float)(int8_t)super[192 + 2 * s], d * (float)(int8_t)super[193 + 2 * s]}, {0, 0}};
    for (int h = 0; h < 2; h++) {
        const u8x16 low = *(const u8x16 *)(ql + 16 * h);
        k.q[h] = ((t / 2 ? low >> 4 : low & 0x0f) | two_bits(*(const u8x16 *)(qh + 16 * h), t) << 4) - 32;
    }
    return k;
}

/* `type` one of this header's, a constant once inlined. */
static inline __attribute__((always_inline)) QBlock qblock_of(const uint8_t *row, int32_t type, int64_t b) {
    switch (type) {
    case WEIGHTS_Q5_0: return q5_block(row, b, 0);
    case WEIGHTS_Q5_1: return q5_block(row, b, 1);
    case WEIGHTS_Q4_K: return k_block(row, b, 0);
    case WEIGHTS_Q5_K: return k_block(row, b, 1);
    default: return q6_k_block(row, b);
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

/* d * sc and dmin * mn of a Q4_K / Q5_K sub-block, in lanes 0 and 1: the products gguf rounds (exactly). */
static inline __m128 k_scales(const uint8_t *super, int s) {
    int sc, mn;
    k_scale_min(super + 4, s, &sc, &mn);
    return _mm_mul_ps(two_halves(super), _mm_cvtepi32_ps(_mm_setr_epi32(sc, mn, 0, 0)));
}

/* Q5_0 / Q5_1: bytes widened by their loads (deq_q4's AVX2 note). Weight j's fifth bit, bit j of qh, is brought
 * to bit 4 by a per-lane shift of qh, shifted left 4 for weights 0-15 and right 12 for 16-31 (no count is
 * negative). Q5_0: qh inverted, so 16 where the bit is clear, subtracted from the nibble: q - 16 as an exact
 * integer, then d * (q - 16) as gguf (exact, its zero's sign too). Q5_1: d * q + m as one FMA (d * q exact). */
static inline __attribute__((always_inline)) void deq_q5(const uint8_t *row, int64_t b, int with_min, vec8 out[4]) {
    const uint8_t *block = row + b * (with_min ? Q5_1_BYTES : Q5_0_BYTES), *at_qh = block + (with_min ? 4 : 2);
    uint32_t qh;
    memcpy(&qh, at_qh, sizeof qh);
    if (!with_min) qh = ~qh;
    const __m128 dm = two_halves(block); /* Q5_0: d, and qh's first two bytes (unused) */
    const __m256 d = lane0(dm), m = lane1(dm);
    const __m256i low = _mm256_set1_epi32(0x0f), bit4 = _mm256_set1_epi32(0x10);
    const __m256i first = _mm256_set1_epi32((int)(qh << 4)), second = _mm256_set1_epi32((int)(qh >> 12));
    for (int h = 0; h < 2; h++) {
        const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(at_qh + 4 + 8 * h)));
        const __m256i shift = _mm256_setr_epi32(8 * h, 8 * h + 1, 8 * h + 2, 8 * h + 3, 8 * h + 4, 8 * h + 5,
                                                8 * h + 6, 8 * h + 7);
        const __m256i fifth[2] = {_mm256_and_si256(_mm256_srlv_epi32(first, shift), bit4),
                                  _mm256_and_si256(_mm256_srlv_epi32(second, shift), bit4)};
        const __m256i nibbles[2] = {_mm256_and_si256(bytes, low), _mm256_srli_epi32(bytes, 4)};
        for (int i = 0; i < 2; i++) {
            const __m256i q = with_min ? _mm256_or_si256(nibbles[i], fifth[i]) : _mm256_sub_epi32(nibbles[i], fifth[i]);
            out[h + 2 * i] = with_min ? (vec8)_mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), m)
                                      : (vec8)_mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
        }
    }
}

/* Q4_K: bytes widened by their loads, the sub-block's nibble by a shift of 0 or 4; (d * sc) * q - dmin * mn as
 * one FMA ((d * sc) * q exact). */
static inline __attribute__((always_inline)) void deq_q4_k(const uint8_t *row, int64_t b, vec8 out[4]) {
    const uint8_t *super = row + b / 8 * Q4_K_BYTES;
    const int s = (int)(b % 8);
    const __m128 dm = k_scales(super, s);
    const __m256 d = lane0(dm), m = lane1(dm);
    const uint8_t *q = super + 16 + 32 * (s / 2);
    const __m128i shift = _mm_cvtsi32_si128(4 * (s % 2));
    const __m256i low = _mm256_set1_epi32(0x0f);
    for (int u = 0; u < 4; u++) {
        const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * u)));
        const __m256i nibbles = _mm256_and_si256(_mm256_srl_epi32(bytes, shift), low);
        out[u] = (vec8)_mm256_fmsub_ps(d, _mm256_cvtepi32_ps(nibbles), m);
    }
}

/* Q5_K: the 32 nibbles and fifth bits combined as bytes (16-bit shifts, then masks that drop what crossed from
 * the neighbouring byte), then widened; the FMA of Q4_K. */
static inline __attribute__((always_inline)) void deq_q5_k(const uint8_t *row, int64_t b, vec8 out[4]) {
    const uint8_t *super = row + b / 8 * Q5_K_BYTES;
    const int s = (int)(b % 8);
    const __m128 dm = k_scales(super, s);
    const __m256 d = lane0(dm), m = lane1(dm);
    const __m256i qs = _mm256_loadu_si256((const __m256i *)(super + 48 + 32 * (s / 2)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(super + 16));
    const __m256i nibbles = _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(4 * (s % 2))),
                                             _mm256_set1_epi8(0x0f));
    const __m256i fifth = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s)), _mm256_set1_epi8(1));
    __m256i q[4];
    widen32(_mm256_or_si256(nibbles, _mm256_slli_epi16(fifth, 4)), 0, q); /* 0 or 1 << 4 stays in its byte */
    for (int u = 0; u < 4; u++) out[u] = (vec8)_mm256_fmsub_ps(d, _mm256_cvtepi32_ps(q[u]), m);
}

/* Q6_K: q - 32 as signed bytes (16-bit shifts and masks as Q5_K), widened; (d * scale) * (q - 32) one product,
 * with the scale of weights 0-15 or 16-31. */
static inline __attribute__((always_inline)) void deq_q6_k(const uint8_t *row, int64_t b, vec8 out[4]) {
    const uint8_t *super = row + b / 8 * Q6_K_BYTES;
    const int s = (int)(b % 8), t = s % 4;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(super + 64 * (s / 4) + 32 * (t % 2)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(super + 128 + 32 * (s / 4)));
    const __m256i low = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (t / 2))), _mm256_set1_epi8(0x0f));
    const __m256i high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), _mm256_set1_epi8(3));
    __m256i q[4];
    widen32(_mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32)), 1, q);
    const __m128i scales = _mm_setr_epi32((int8_t)super[192 + 2 * s], (int8_t)super[193 + 2 * s], 0, 0);
    const __m128 ds = _mm_mul_ps(_mm_set1_ps(half_to_float(load_u16(super + 208))), _mm_cvtepi32_ps(scales));
    const __m256 d[2] = {lane0(ds), lane1(ds)};
    for (int u = 0; u < 4; u++) out[u] = (vec8)_mm256_mul_ps(d[u / 2], _mm256_cvtepi32_ps(q[u]));
}
#else
static inline __attribute__((always_inline)) void deq_qblock(QBlock k, int kind, vec8 out[4]) {
    deq16(k.q[0], k.d[0], k.m[0], kind, out);
    deq16(k.q[1], k.d[1], k.m[1], kind, out + 2);
}

static inline __attribute__((always_inline)) void deq_q5(const uint8_t *row, int64_t b, int with_min, vec8 out[4]) {
    deq_qblock(q5_block(row, b, with_min), with_min ? DEQ_MIN : DEQ_SIGNED, out);
}

static inline __attribute__((always_inline)) void deq_q4_k(const uint8_t *row, int64_t b, vec8 out[4]) {
    deq_qblock(k_block(row, b, 0), DEQ_MIN, out);
}

static inline __attribute__((always_inline)) void deq_q5_k(const uint8_t *row, int64_t b, vec8 out[4]) {
    deq_qblock(k_block(row, b, 1), DEQ_MIN, out);
}

static inline __attribute__((always_inline)) void deq_q6_k(const uint8_t *row, int64_t b, vec8 out[4]) {
    deq_qblock(q6_k_block(row, b), DEQ_SIGNED, out);
}
#endif

#endif
