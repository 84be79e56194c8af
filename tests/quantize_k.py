"""A plain quantizer for the K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, which the `gguf` package dequantizes but cannot
quantize: test model files hold these types with weights near the values they were made from (a
round-to-nearest quantizer, not llama.cpp's search; the blocks are valid whatever it picks, since the readers
are tested against gguf's dequantization of the same bytes).

Layouts (quant_k.h, kernels/quant_blocks.cuh): per super-block of 256 weights, Q4_K / Q5_K hold f16 d, f16 dmin,
12 bytes of 6-bit sub-block scales and mins, Q5_K 32 bytes of fifth bits, then 128 bytes of nibbles; Q6_K holds
128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales and f16 d; Q2_K 16 bytes of 4-bit scales and
mins, 64 of 2-bit integers, f16 d and dmin; Q3_K 32 bytes of third bits, 64 of 2-bit integers, 12 of 6-bit
scales and f16 d.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

QK_K = 256


def quantize(values: np.ndarray, qtype: Q) -> np.ndarray:
    """(rows, cols) float -> (rows, row bytes) uint8 blocks of `qtype`; cols a multiple of 256."""
    rows, cols = values.shape
    supers = np.asarray(values, np.float32).reshape(-1, QK_K)
    if qtype in (Q.Q2_K, Q.Q3_K):
        blocks = _q2_k(supers) if qtype == Q.Q2_K else _q3_k(supers)
    else:
        blocks = _q6_k(supers) if qtype == Q.Q6_K else _q45_k(supers, five=qtype == Q.Q5_K)
    return blocks.reshape(rows, -1)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(len(x), 2)


def _levels(x: np.ndarray, scale: np.ndarray, low: int, high: int) -> np.ndarray:
    safe = np.where(scale == 0, 1, scale)
    return np.clip(np.rint(x / safe), low, high).astype(np.int32)


def _q45_k(x: np.ndarray, five: bool) -> np.ndarray:
    """Each sub-block of 32: weight = (d * sc) * q - dmin * mn, q in 0 .. 15 (31 with the fifth bit)."""
    top = 31 if five else 15
    sub = x.reshape(len(x), 8, 32)
    mins = np.maximum(0.0, -sub.min(axis=2))
    ranges = (sub.max(axis=2) + mins) / top
    d = (ranges.max(axis=1) / 63).astype(np.float16).astype(np.float32)
    dmin = (mins.max(axis=1) / 63).astype(np.float16).astype(np.float32)
    sc = _levels(ranges, d[:, None], 0, 63)
    mn = _levels(mins, dmin[:, None], 0, 63)
    q = _levels(sub + (dmin[:, None] * mn)[..., None], (d[:, None] * sc)[..., None], 0, top)
    out = [_f16(d), _f16(dmin), _pack_scales(sc, mn)]
    if five:
        out.append(np.bitwise_or.reduce((q >> 4 & 1) << np.arange(8)[None, :, None], axis=1).astype(np.uint8))
    nibbles = q & 0xF  # sub-blocks 2i and 2i + 1 share bytes 32i .. 32i + 31, low and high nibbles
    out.append((nibbles[:, 0::2] | nibbles[:, 1::2] << 4).reshape(len(x), 128).astype(np.uint8))
    return np.concatenate(out, axis=1)


def _pack_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """gguf's get_scale_min inverted: bytes s, s + 4 (s < 4) hold sc[s], mn[s] and the top bits of sc[s + 4],
    mn[s + 4]; bytes 8 + s their low nibbles."""
    low = np.concatenate([sc[:, :4] | (sc[:, 4:] >> 4) << 6, mn[:, :4] | (mn[:, 4:] >> 4) << 6], axis=1)
    return np.concatenate([low, (sc[:, 4:] & 0xF) | (mn[:, 4:] & 0xF) << 4], axis=1).astype(np.uint8)


def _q6_k(x: np.ndarray) -> np.ndarray:
    """Each 16 weights: weight = (d * scale) * (q - 32), q in 0 .. 63, scale an int8."""
    groups = x.reshape(len(x), 16, 16)
    amax = np.abs(groups).max(axis=2) / 31
    d = (amax.max(axis=1) / 127).astype(np.float16).astype(np.float32)
    scale = _levels(amax, d[:, None], -128, 127)
    q = (_levels(groups, (d[:, None] * scale)[..., None], -32, 31) + 32).reshape(len(x), 2, 4, 32)
    # Half h, sub-block pair t: low nibbles into ql bytes 64h + 32 (t % 2) + i (high nibbles for t >= 2), the
    # two high bits into bits 2t of qh bytes 32h + i.
    low = q & 0xF
    ql = (low[:, :, 0:2] | low[:, :, 2:4] << 4).reshape(len(x), 128)
    qh = np.bitwise_or.reduce((q >> 4) << (2 * np.arange(4))[None, None, :, None], axis=2).reshape(len(x), 64)
    return np.concatenate([ql.astype(np.uint8), qh.astype(np.uint8), scale.astype(np.int8).view(np.uint8),
                           _f16(d)], axis=1)


def _two_bits(q: np.ndarray) -> np.ndarray:
    """Q2_K's and Q3_K's qs: weight 128h + 32j + i (q's low 2 bits) into bits 2j of byte 32h + i."""
    parts = (q & 3).reshape(len(q), 2, 4, 32) << (2 * np.arange(4))[None, None, :, None]
    return np.bitwise_or.reduce(parts, axis=2).reshape(len(q), 64).astype(np.uint8)


def _q2_k(x: np.ndarray) -> np.ndarray:
    """Each 16 weights: weight = (d * sc) * q - dmin * mn, q in 0 .. 3, sc and mn in 0 .. 15."""
    groups = x.reshape(len(x), 16, 16)
    mins = np.maximum(0.0, -groups.min(axis=2))
    ranges = (groups.max(axis=2) + mins) / 3
    d = (ranges.max(axis=1) / 15).astype(np.float16).astype(np.float32)
    dmin = (mins.max(axis=1) / 15).astype(np.float16).astype(np.float32)
    sc, mn = _levels(ranges, d[:, None], 0, 15), _levels(mins, dmin[:, None], 0, 15)
    q = _levels(groups + (dmin[:, None] * mn)[..., None], (d[:, None] * sc)[..., None], 0, 3)
    return np.concatenate([(sc | mn << 4).astype(np.uint8), _two_bits(q.reshape(len(x), 256)), _f16(d), _f16(dmin)],
                          axis=1)


def _q3_k(x: np.ndarray) -> np.ndarray:
    """Each 16 weights: weight = (d * scale) * q, q in -4 .. 3, scale in -32 .. 31; stored q + 4, its third bit
    in hmask (bit s of byte i for weight 32s + i), the 6-bit scale + 32 packed as gguf unpacks it."""
    groups = x.reshape(len(x), 16, 16)
    amax = np.abs(groups).max(axis=2) / 4
    d = (amax.max(axis=1) / 31).astype(np.float16).astype(np.float32)
    scale = _levels(amax, d[:, None], -32, 31)
    stored = (_levels(groups, (d[:, None] * scale)[..., None], -4, 3) + 4).reshape(len(x), 8, 32)
    hmask = np.bitwise_or.reduce((stored >> 2) << np.arange(8)[None, :, None], axis=1).astype(np.uint8)
    packed = scale + 32
    low = packed[:, :8] & 0xF | (packed[:, 8:] & 0xF) << 4  # bytes 0 .. 7: scales g and g + 8
    high = np.bitwise_or.reduce((packed >> 4).reshape(len(x), 4, 4) << (2 * np.arange(4))[None, :, None], axis=1)
    return np.concatenate([hmask, _two_bits(stored.reshape(len(x), 256)), low.astype(np.uint8),
                           high.astype(np.uint8), _f16(d)], axis=1)
