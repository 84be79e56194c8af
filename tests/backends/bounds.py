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
