"""What the engine checks of a backend's output before it trusts it: a bad token id is a backend error, caught
where it enters, not an IndexError deep in the detokenizer."""

from __future__ import annotations

import numpy as np

from backends.base import StepOutput


class BadStepOutputError(Exception):
    """The output as a whole does not fit the step (shape, type): none of its rows can be used."""


def out_of_vocabulary(output: StepOutput, num_sampled: int, vocab_size: int) -> list[tuple[int, int]]:
    """(row, token id) of each sampled row whose token is not in the vocabulary; raises BadStepOutputError
    when the output does not have one integer token per sampled row."""
    ids = output.token_ids
    if not isinstance(ids, np.ndarray) or ids.shape != (num_sampled,) or not np.issubdtype(ids.dtype, np.integer):
        shape = getattr(ids, "shape", type(ids).__name__)
        dtype = getattr(ids, "dtype", "?")
        raise BadStepOutputError(f"the backend returned token ids of shape {shape} and type {dtype} "
                                 f"for {num_sampled} sampled rows")
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    return [(int(row), int(ids[row])) for row in bad]
