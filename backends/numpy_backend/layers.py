"""Elementwise pieces of the decoder forward, in float32."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    mean_square = np.add.reduce(np.square(x), axis=-1, keepdims=True) / np.float32(x.shape[-1])  # not np.mean:
    return x / np.sqrt(mean_square + np.float32(eps)) * weight  # its Python wrapper costs more than the math


def silu_mul(gate_up: np.ndarray) -> np.ndarray:
    """SwiGLU: the first half of the last axis is the gate, the second the up projection."""
    half = gate_up.shape[-1] // 2
    gate, up = gate_up[..., :half], gate_up[..., half:]
    return gate / (1.0 + np.exp(-gate)) * up


def gelu_tanh_mul(gate_up: np.ndarray) -> np.ndarray:
    """GeGLU: GELU (tanh approximation, as Gemma's `gelu_pytorch_tanh`) of the gate half, times the up half."""
    half = gate_up.shape[-1] // 2
    gate, up = gate_up[..., :half], gate_up[..., half:]
    inner = np.float32(np.sqrt(2.0 / np.pi)) * (gate + np.float32(0.044715) * gate * gate * gate)
    return np.float32(0.5) * gate * (np.float32(1.0) + np.tanh(inner)) * up


ACTIVATIONS = {"silu": silu_mul, "gelu_tanh": gelu_tanh_mul}


@dataclass(frozen=True)
class RopeTable:
    """cos/sin per (position, pair). Pairs are interleaved (2i, 2i+1): the GGUF layout of Q and K rows."""

    cos: np.ndarray  # (max_positions, head_dim // 2)
    sin: np.ndarray

    @classmethod
    def build(cls, head_dim: int, theta: float, max_positions: int, factors: Sequence[float] = ()) -> RopeTable:
        """factors: each pair's frequency divisor (Llama 3's RoPE scaling); empty: none."""
        inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        if len(factors):
            inv_freq = inv_freq / np.asarray(factors, dtype=np.float64)
        angles = np.outer(np.arange(max_positions, dtype=np.float64), inv_freq)
        return cls(np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32))

    def at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin (T, 1, head_dim // 2) for a step's positions: looked up once, used by every layer."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]

    def apply(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotate x (T, heads, head_dim) by each token's position."""
        return rotate(x, *self.at(positions))


def rotate_halves(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate the pairs (i, i + head_dim / 2) of x (T, heads, head_dim), NeoX's layout, by cos, sin
    (T, 1, head_dim // 2)."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate the interleaved pairs of x (T, heads, head_dim) by angles given as cos, sin (T, 1, head_dim // 2)."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    out = np.empty_like(pairs)
    out[..., 0] = even * cos - odd * sin
    out[..., 1] = even * sin + odd * cos
    return out.reshape(x.shape)
