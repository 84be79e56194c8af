"""Error bounds of the kernels' float32 arithmetic, from the computation's shape rather than from what one CPU
gave: the tests compare the kernels with a float64 reference within these, on every tier."""

from __future__ import annotations

import numpy as np

U = 2.0**-24  # float32's unit roundoff


def dot_bound(x: np.ndarray, w: np.ndarray, lanes: int = 16) -> np.ndarray:
    """Worst-case error of x (m, k) @ w (n, k).T in float32 summed in at most `lanes` lanes and then a tree:
    any product passes through at most k / lanes + log2(lanes) + 2 roundings (its product, its lane's adds, the
    tree's, the result's), each within U of the value so far, so the error is at most that many U times
    sum |x| |w| (Higham's gamma_k, first order). 16 lanes covers AVX-512's sums and every 8-lane one; a lane
    count of 1 is a sequential sum."""
    k = x.shape[1]
    steps = -(-k // lanes) + int(np.log2(lanes)) + 2
    return steps * U * (np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64))


def assert_within(out: np.ndarray, reference: np.ndarray, bound: np.ndarray) -> None:
    """|out - reference| <= bound elementwise, naming the worst element's excess when it fails."""
    error = np.abs(out.astype(np.float64) - reference)
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert np.all(error <= bound), f"error {error[worst]:.3g} over the bound {bound[worst]:.3g} at {worst}"


def attention_bound(q: np.ndarray, k: np.ndarray, weighted: np.ndarray, context: int, lanes: int = 16
                    ) -> np.ndarray:
    """Worst-case float32 error of attention outputs o = sum_j w_j v_j / sum_j w_j over at most `context` keys,
    given `weighted` = sum_j w_j |v_j| / sum_j w_j (in float64, the same shape as the outputs). Two parts, first
    order in U: the sums over the context, at most context + 4 roundings each (the running sums, the rescales
    of the online softmax, the final division) times `weighted`; and each weight's relative error kappa (its
    score's dot product, at most dim / lanes + 6 roundings of scale * sum |q| |k|, then exp's few), which moves
    o by at most sum_j w_j |v_j - o| kappa <= 2 kappa * weighted."""
    dim = q.shape[-1]
    score_size = dim**-0.5 * np.abs(q.astype(np.float64)).sum(axis=-1, keepdims=True) * np.abs(k).max()
    kappa = (-(-dim // lanes) + 6) * score_size + 4
    return U * (context + 4 + 2 * kappa) * weighted


def forward_bound(layers: int, hidden: int, ffn: int, q_width: int, head_dim: int, context: int, qk_gain: float,
                  magnitude: float) -> float:
    """First-order error bound of a float32 decoder forward's outputs (logits or K/V) of size up to `magnitude`,
    between two implementations that each round in float32 (twice one's error), for models whose QK norms bound
    the scores: the float32 roundings along the longest chain any output passes through, times U, relative to
    its size. Per layer, each projection's dot_bound steps (inner width / 8 + 5), each RMSNorm's (width / 8 + 6:
    its sum of squares, the square root, the division and the weight), and attention_bound's context + 4 + 2
    kappa, with scores at most head_dim * qk_gain (a normed head's entries are at most sqrt(head_dim) times its
    weight, qk_gain the product of the Q and K norm weights' largest); then the final norm and the head. The
    RMSNorms scale each layer's input to the same size, so a relative error passes through them unamplified to
    first order."""
    projections = sum(width // 8 + 5 for width in (hidden, q_width, hidden, ffn))
    norms = 4 * (hidden // 8 + 6) + (head_dim // 8 + 6)
    kappa = (-(-head_dim // 16) + 6) * head_dim * qk_gain + 4
    per_layer = projections + norms + context + 4 + 2 * kappa
    steps = layers * per_layer + (hidden // 8 + 6) + (hidden // 8 + 5)
    return 2 * steps * U * magnitude
