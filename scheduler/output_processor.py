"""Per-request bookkeeping between the scheduler and a request's reader: text deltas, stop strings, usage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from scheduler.errors import InvalidRequestError
from scheduler.guided import GuideFactory
from scheduler.outputs import ChoiceDelta, RequestStream, TokenLogprob
from scheduler.request import EngineRequest
from scheduler.scheduler import Scheduler
from scheduler.sequence import Sequence, SequenceStatus
from scheduler.step import StepUpdates
from scheduler.stop import Detokenizer, TextAssembler


class TokenizerLike(Protocol):
    """What the engine needs of a tokenizer (backends.model.tokenizer.Tokenizer fits)."""

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    @property
    def vocab_size(self) -> int: ...

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
    step_tokens: int = 0  # tokens this request got in the current step
    completion_tokens: int = 0  # output tokens of all its choices so far, counted at the end of each step

    @property
    def finished(self) -> bool:
        return all(s.status.finished for s in self.seqs)

    @property
    def cached_tokens(self) -> int:
        return self.seqs[0].num_cached_tokens

    @property
    def finish_reason(self) -> str:
        reasons = [s.status.finish_reason or "abort" for s in self.seqs]
        return reasons[0] if len(set(reasons)) == 1 else ",".join(reasons)


def new_request_state(request: EngineRequest, first_seq_id: int, tokenizer: TokenizerLike,
                      guides: GuideFactory | None = None) -> RequestState:
    """The request's n sequences (each with its own generator: seed + choice index, and its own place in the
    request's grammar when it has one) and its stream."""
    seqs = [_sequence(request, first_seq_id + i, i) for i in range(request.params.n)]
    if request.params.guide is not None:
        if guides is None:
            raise InvalidRequestError("constrained decoding is not available on this engine", "response_format")
        for seq in seqs:
            seq.guide = guides.guide(request.params.guide)
    params = request.params
    texts = [TextAssembler(tokenizer.detokenizer(params.skip_special_tokens), params.stop,
                           params.include_stop_str_in_output) for _ in seqs]
    return RequestState(request, seqs, RequestStream(request.request_id, len(request.prompt_token_ids)), texts)


def _sequence(request: EngineRequest, seq_id: int, index: int) -> Sequence:
    seed = request.params.seed
    rng = np.random.default_rng(None if seed is None else [seed % 2**64, index])
    return Sequence(seq_id=seq_id, request_id=request.request_id, index=index,
                    prompt_len=len(request.prompt_token_ids), token_ids=list(request.prompt_token_ids),
                    params=request.params, priority=request.priority, arrival_time=request.arrival_time, rng=rng)


def apply_updates(requests: dict[str, RequestState], updates: StepUpdates, scheduler: Scheduler
                  ) -> tuple[dict[str, RequestState], dict[str, RequestState], dict[str, Exception]]:
    """Each new token into its request's stream. Returns the requests that got tokens, in step order, those of
    them with a choice that ended this step, and those whose output could not be processed (with the error):
    a failure in one request's detokenizer or stop check is that request's alone."""
    touched: dict[str, RequestState] = {}
    ending: dict[str, RequestState] = {}
    broken: dict[str, Exception] = {}
    logprobs, finished = updates.logprobs, updates.finished
    ended: dict[int, list[int]] = {}  # seq id -> [tokens it got after it ended]: a stop string amid kept guesses
    for i, (seq, token) in enumerate(zip(updates.seqs, updates.token_ids, strict=True)):
        if seq.request_id in broken:
            continue
        if seq.seq_id in ended:
            ended[seq.seq_id].append(token)
            continue
        state = touched[seq.request_id] = requests[seq.request_id]
        state.step_tokens += 1
        try:
            if emit_token(state, seq, token, logprobs[i] if logprobs else None, i in finished, scheduler):
                ending[seq.request_id] = state
                ended[seq.seq_id] = []
        except Exception as exc:  # noqa: BLE001 - the caller fails this request and logs why
            broken[seq.request_id] = exc
    _drop_after_end(updates.seqs, ended)
    for request_id in broken:
        touched.pop(request_id, None)
        ending.pop(request_id, None)
    return touched, ending, broken


def _drop_after_end(seqs: list[Sequence], ended: dict[int, list[int]]) -> None:
    """A sequence ended by a stop string keeps no token after it (a step verifying guesses can append several)."""
    for seq in {s.seq_id: s for s in seqs if ended.get(s.seq_id)}.values():
        del seq.token_ids[-len(ended[seq.seq_id]) :]


def emit_token(state: RequestState, seq: Sequence, token: int, logprob: TokenLogprob | None, finished: bool,
               scheduler: Scheduler) -> bool:
    """Detokenize one new token into the stream; a stop string ends the sequence here. True if it ended."""
    text_of = state.texts[seq.index].text_of
    if text_of is not None and not finished:  # the usual token: no stop strings, no stop
        state.stream.add_token(seq.index, text_of(token), token, logprob)
        return False
    text, stop = state.texts[seq.index].push_token(token)
    if stop is None and not finished:
        state.stream.add_token(seq.index, text, token, logprob)
        return False
    if stop is not None:
        scheduler.stop_on_string(seq, stop)
    state.stream.add_token(seq.index, text if stop is not None else text + state.texts[seq.index].finish(), token,
                           logprob)
    state.stream.end_choice(seq.index, seq.status.finish_reason, seq.stop_reason)
    return True


def close_aborted(state: RequestState, error: str | None, code: str | None = None) -> None:
    """Tell the reader that every still-open choice ended by abort, then end the stream."""
    for seq in state.seqs:
        if seq.status is SequenceStatus.FINISHED_ABORTED:
            state.stream.put(ChoiceDelta(seq.index, finish_reason="abort"), state.completion_tokens,
                             state.cached_tokens)
    state.stream.finish(error, code)
