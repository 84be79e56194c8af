"""Per-request bookkeeping between the scheduler and a request's reader: text deltas, stop strings, usage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from scheduler.outputs import ChoiceDelta, RequestStream
from scheduler.request import EngineRequest
from scheduler.scheduler import Scheduler, SeqUpdate
from scheduler.sequence import Sequence, SequenceStatus
from scheduler.stop import Detokenizer, TextAssembler


class TokenizerLike(Protocol):
    """What the engine needs of a tokenizer (backends.model.tokenizer.Tokenizer fits)."""

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    def detokenizer(self, skip_special_tokens: bool = True) -> Detokenizer: ...


@dataclass
class RequestState:
    request: EngineRequest
    seqs: list[Sequence]
    stream: RequestStream
    texts: list[TextAssembler]
    first_scheduled: float | None = None
    first_token: float | None = None
    error: str | None = None
    step_tokens: int = field(default=0)  # tokens this request got in the current step (telemetry)

    @property
    def finished(self) -> bool:
        return all(s.status.finished for s in self.seqs)

    @property
    def completion_tokens(self) -> int:
        return sum(s.num_output_tokens for s in self.seqs)

    @property
    def cached_tokens(self) -> int:
        return self.seqs[0].num_cached_tokens

    @property
    def finish_reason(self) -> str:
        reasons = [s.status.finish_reason or "abort" for s in self.seqs]
        return reasons[0] if len(set(reasons)) == 1 else ",".join(reasons)


def new_request_state(request: EngineRequest, first_seq_id: int, tokenizer: TokenizerLike) -> RequestState:
    """The request's n sequences (each with its own generator: seed + choice index) and its stream."""
    seqs = [_sequence(request, first_seq_id + i, i) for i in range(request.params.n)]
    texts = [TextAssembler(tokenizer.detokenizer(request.params.skip_special_tokens), request.params.stop)
             for _ in seqs]
    return RequestState(request, seqs, RequestStream(request.request_id, len(request.prompt_token_ids)), texts)


def _sequence(request: EngineRequest, seq_id: int, index: int) -> Sequence:
    seed = request.params.seed
    rng = np.random.default_rng(None if seed is None else [seed % 2**64, index])
    return Sequence(seq_id=seq_id, request_id=request.request_id, index=index,
                    prompt_len=len(request.prompt_token_ids), token_ids=list(request.prompt_token_ids),
                    params=request.params, priority=request.priority, arrival_time=request.arrival_time, rng=rng)


def apply_update(state: RequestState, update: SeqUpdate, scheduler: Scheduler) -> None:
    """Detokenize one new token into the request's stream; a stop string ends the sequence here."""
    seq = update.seq
    text, stop = state.texts[seq.index].push([update.token_id])
    finished = update.finished
    if stop is not None and not finished:
        scheduler.finish(seq, SequenceStatus.FINISHED_STOPPED, stop)
        finished = True
    elif stop is not None:
        seq.status, seq.stop_reason = SequenceStatus.FINISHED_STOPPED, stop
    if finished and stop is None:
        text += state.texts[seq.index].finish()
    delta = ChoiceDelta(seq.index, text, [update.token_id],
                        [update.logprob] if update.logprob is not None else None,
                        seq.status.finish_reason if finished else None, seq.stop_reason if finished else None)
    state.stream.put(delta, state.completion_tokens, state.cached_tokens)


def close_aborted(state: RequestState, error: str | None) -> None:
    """Tell the reader that every still-open choice ended by abort, then end the stream."""
    for seq in state.seqs:
        if seq.status is SequenceStatus.FINISHED_ABORTED:
            state.stream.put(ChoiceDelta(seq.index, finish_reason="abort"), state.completion_tokens,
                             state.cached_tokens)
    state.stream.finish(error)
