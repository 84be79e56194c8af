"""The contract between the scheduler and every backend.

The scheduler builds a `StepBatch` (a plan: which tokens to run, where their KV goes, which sequences need a
next token and how to sample it); a backend executes it and returns a `StepOutput`. Everything is flat arrays
so a GPU backend can copy the whole plan to the device in a few transfers.

Contract for a backend's forward pass, per layer: write *all* of the step's new K/V into their slots first,
then attend. A sequence may therefore hit a prefix-cache block that another sequence of the same step is
filling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from backends.step_shape import CostCoefficients, StepShape

IntArray = npt.NDArray[np.int32]
LongArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class KVGeometry:
    """What one token of KV cache is made of; `kvpool` turns this into bytes per block.

    `sliding_window`: the positions a sliding layer attends to (0: the model has none). `window_layers`: how many
    of the layers are sliding layers whose KV this backend can keep in a pool of its own (init_cache's
    window_blocks), a smaller one, since their blocks before a sequence's window are never read again; 0: every
    layer's KV lives in the one pool.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 4
    sliding_window: int = 0
    window_layers: int = 0


class AllowedTokens(Protocol):
    """The tokens each constrained row may sample (a grammar's mask), possibly still being computed."""

    @property
    def positions(self) -> IntArray:
        """(R,) which rows of the step's SamplingInputs are constrained."""
        ...

    def bits(self) -> npt.NDArray[np.int32]:
        """(R, ceil(V / 32)): bit j of word w set when token 32 * w + j is allowed; tokens past the mask's
        width are not. Blocks until the masks are ready, so a backend calls it as late as it can."""
        ...


@dataclass(frozen=True)
class SamplingInputs:
    """Per-sampled-sequence sampling parameters, one row per entry of `StepBatch.sample_rows`.

    `uniforms` are drawn by the scheduler from each request's own seeded generator, so the token a request
    samples does not depend on what else shares its batch. Penalty inputs are None when no row uses them.
    """

    temperature: FloatArray  # 0 means greedy
    top_k: IntArray  # 0 or less means off
    top_p: FloatArray  # 1.0 means off
    min_p: FloatArray  # 0.0 means off
    uniforms: FloatArray  # in [0, 1), one per row
    presence_penalty: FloatArray | None = None
    frequency_penalty: FloatArray | None = None
    repetition_penalty: FloatArray | None = None
    output_token_ids: LongArray | None = None  # (S, Lo), padded with -1
    prompt_token_ids: LongArray | None = None  # (S, Lp), padded with -1
    suppressed_token_ids: LongArray | None = None  # (S, K) ids forced to -inf (min_tokens), padded with -1
    num_top_logprobs: int = 0  # how many alternatives to return (max over rows); 0: none
    want_logprobs: bool = False  # return the sampled token's logprob
    allowed: AllowedTokens | None = None  # grammar masks of the rows that are constrained; None: no row is


@dataclass(frozen=True)
class StepBatch:
    """One engine step's plan. B sequences, T tokens in total (prefill chunks and decode tokens mixed).

    Sequence b owns tokens `query_start[b]:query_start[b+1]`; after the step its KV cache holds
    `context_lens[b]` tokens, the last of them this step's. `block_tables[b, i]` is the physical block of
    its i-th logical block (rows padded with 0 past the sequence's length). A backend samples the logits of
    the tokens at `sample_token_rows()`.

    When the backend's cache has a window pool (init_cache's window_blocks > 0), its sliding layers read and write
    their K/V through `window_tables` and `window_slots` instead, both set in every step; otherwise both are None.
    """

    seq_ids: tuple[int, ...]
    token_ids: IntArray  # (T,)
    positions: IntArray  # (T,)
    slot_mapping: LongArray  # (T,) block_id * block_size + offset
    query_start: IntArray  # (B + 1,)
    context_lens: IntArray  # (B,)
    block_tables: IntArray  # (B, max_blocks)
    sample_rows: IntArray  # (S,) indices into the B sequences that need a next token
    sampling: SamplingInputs | None = None
    block_copies: tuple[tuple[int, int], ...] = ()  # copy-on-write (src, dst), done before the forward
    step_id: int = 0
    # (S,) how many tokens before its sequence's last token each sample row reads its logits at: a sequence
    # verifying k speculative tokens samples k + 1 rows, lags k..0. None: every row reads the last token.
    sample_lag: IntArray | None = None
    # (B, W) the sliding layers' block tables when they have a pool of their own: window_tables[b, i] is the
    # window pool's block for logical block i of sequence b, or -1 where that block lies wholly before the
    # sequence's window (never read). W covers at least context_lens[b] tokens; rows padded with 0 past it.
    window_tables: IntArray | None = None
    window_slots: LongArray | None = None  # (T,) each token's slot in the window pool; negative: padding
    # copy-on-write (src, dst) in the window pool, done before the forward (block_copies then copies in the full
    # layers only)
    window_block_copies: tuple[tuple[int, int], ...] = ()

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    def sample_token_rows(self) -> LongArray:
        """(S,) the token row whose logits each sample row reads."""
        rows = self.query_start[1:][self.sample_rows].astype(np.int64) - 1
        return rows if self.sample_lag is None else rows - self.sample_lag

    def shape(self) -> StepShape:
        """What the step does, for the step-cost model."""
        q = np.diff(self.query_start).astype(np.int64)
        ctx = self.context_lens.astype(np.int64)
        # a chunk's j-th query (0-based from its end) sees ctx - j tokens: sum = q*ctx - q(q-1)/2
        pairs = int((q * ctx - q * (q - 1) // 2).sum())
        return StepShape(self.num_tokens, int(self.sample_rows.shape[0]), int(ctx.sum()), pairs)


@dataclass(frozen=True)
class StepOutput:
    """Sampled tokens for the rows of `StepBatch.sample_rows`, in that order."""

    token_ids: LongArray  # (S,)
    logprobs: FloatArray | None = None  # (S,) logprob of the sampled token
    top_token_ids: LongArray | None = None  # (S, k)
    top_logprobs: FloatArray | None = None  # (S, k)
    timings: dict[str, float] = field(default_factory=dict)  # seconds, for telemetry (e.g. "forward")


class Clock(Protocol):
    """A source of time in seconds."""

    def now(self) -> float: ...


@runtime_checkable
class Backend(Protocol):
    """Everything the engine uses of a backend (a third-party one too: the `pagedserve.backends` entry-point
    group names a factory `(BackendConfig, ModelFiles) -> Backend`). `execute` runs one call at a time, in a
    worker thread unless `step_is_instant`.

    - `name`: for logs and errors.
    - `clock`: the time the engine stamps steps and requests with, when the backend keeps its own (the sim
      backend's virtual clock, so simulated runs report simulated timings); None: wall time (monotonic).
    - `step_is_instant`: `execute` neither computes for long nor blocks, so the engine calls it on the event
      loop: a worker-thread hop would cost more than the step.
    - `cost_prior()`: a first guess at the backend's step times; the scheduler's online fit corrects it, so a
      cautious guess (over, not under) is enough, and `CostCoefficients()` (all zero) says nothing is known.
    - `kv_geometry`, `init_cache()`: the KV cache's shape per token, then its size, once, before the first step.
      `init_cache(num_blocks, block_size, window_blocks)`: with window_blocks > 0 (only where kv_geometry
      reports window_layers), the sliding layers' K/V live in a pool of window_blocks blocks of their own, and
      every step brings their window_tables and window_slots; 0: every layer lives in the num_blocks pool.
    """

    name: str

    @property
    def clock(self) -> Clock | None: ...

    @property
    def step_is_instant(self) -> bool: ...

    @property
    def kv_geometry(self) -> KVGeometry: ...

    def cost_prior(self) -> CostCoefficients: ...

    def init_cache(self, num_blocks: int, block_size: int, window_blocks: int = 0) -> None: ...

    def execute(self, batch: StepBatch) -> StepOutput: ...


class BackendError(RuntimeError):
    """A backend could not be created or could not run a step; the message is meant for users."""

