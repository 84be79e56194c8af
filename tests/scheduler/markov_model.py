"""A model stand-in whose next-token distribution depends on the token before it only (a Markov chain over a
small vocabulary), sampled by the real sampler. Its greedy output soon cycles, so prompt lookup's guesses are
often right, and its sampled output has known probabilities, so a test can check a distribution exactly."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from backends.base import KVGeometry, StepBatch, StepOutput
from backends.sampling import sample
from backends.step_shape import CostCoefficients

VOCAB = 24
EOS = 2


class MarkovBackend:
    name = "markov"
    clock = None
    step_is_instant = True

    def __init__(self, seed: int = 0, sharpness: float = 3.0, eos_weight: float = -4.0) -> None:
        rng = np.random.default_rng(seed)
        self.logits = (sharpness * rng.standard_normal((VOCAB, VOCAB))).astype(np.float32)
        self.logits[:, EOS] = eos_weight  # rare, so outputs are long
        self.logits[:, :2] = -np.inf  # never sampled (0 and 1 only appear in prompts)
        self.steps: list[StepBatch] = []

    def probabilities(self, previous: int, temperature: float) -> np.ndarray:
        z = self.logits[previous].astype(np.float64) / temperature
        p = np.exp(z - z.max())
        return p / p.sum()

    @property
    def kv_geometry(self) -> KVGeometry:
        return KVGeometry(1, 1, 1)

    def cost_prior(self) -> CostCoefficients:
        return CostCoefficients()

    def init_cache(self, num_blocks: int, block_size: int, window_blocks: int = 0) -> None:
        pass

    def execute(self, batch: StepBatch) -> StepOutput:
        self.steps.append(batch)
        if batch.sampling is None:
            return StepOutput(np.zeros(0, np.int64))
        previous = batch.token_ids[batch.sample_token_rows()] % VOCAB
        result = sample(np, self.logits[previous], batch.sampling)
        return StepOutput(result.token_ids, result.logprobs, result.top_token_ids, result.top_logprobs)


class MarkovTokenizer:
    eos_token_ids = (EOS,)
    vocab_size = VOCAB

    def detokenizer(self, skip_special_tokens: bool = True) -> MarkovDetokenizer:
        return MarkovDetokenizer()


class MarkovDetokenizer:
    """Token t reads as the letter chr(ord('a') + t): stop strings can be tested."""

    def push(self, ids: Sequence[int]) -> str:
        return "".join(self.push_token(i) for i in ids)

    def push_token(self, token_id: int) -> str:
        return chr(ord("a") + token_id % 26)

    def flush(self) -> str:
        return ""
