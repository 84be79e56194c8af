"""Speculative decoding in the scheduler: prompt lookup's guesses, verified in the step, change no output.

The model is a Markov chain (tests/scheduler/markov_model.py) sampled by the real sampler: greedy outputs cycle,
so guesses are often kept, and sampled outputs have known probabilities. Every run checks the KV pool's and the
rows' invariants after every step (debug_checks)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from backends.step_shape import CostCoefficients
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig, SpeculativeConfig
from scheduler.guesses import Proposals, guess_threshold
from scheduler.llm import LLM
from scheduler.outputs import RequestOutput
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.speculation import MISSES_BEFORE_PAUSE, Guessing, NgramIndex, SpecCounters, Speculator
from telemetry.interface import NullObserver, RequestRecord
from tests.scheduler.markov_model import VOCAB, MarkovBackend, MarkovTokenizer

NGRAM = SpeculativeConfig("ngram", num_speculative_tokens=4, ngram_max=3)


class Recorder(NullObserver):
    """Counts preemptions and keeps the records of finished requests (their choices' token lists)."""

    def __init__(self) -> None:
        self.count = 0
        self.finished: list[RequestRecord] = []

    def request_preempted(self, request_id: str, now: float) -> None:
        self.count += 1

    def request_finished(self, record: RequestRecord) -> None:
        self.finished.append(record)


def generate(prompts: list[list[int]], params: SamplingParams, speculative: SpeculativeConfig | None,
             num_blocks: int = 64, observer: Recorder | None = None, **config: Any
             ) -> tuple[list[RequestOutput], SpecCounters | None, int]:
    """Outputs, the speculation counters, and how many preemptions the run had."""
    observer = observer or Recorder()
    llm = LLM(SchedulerConfig(debug_checks=True, **config), PagedKVCacheManager(num_blocks, 4), MarkovBackend(),
              MarkovTokenizer(), max_model_len=256, observer=observer, speculative=speculative)
    outputs = llm.generate(prompts, params)
    speculator = llm.core.scheduler.speculator
    return outputs, None if speculator is None else speculator.counters, observer.count


def seen(outputs: list[RequestOutput]) -> list[list[tuple[Any, ...]]]:
    """Everything a client sees of each choice."""
    return [[(c.token_ids, c.text, c.logprobs, c.finish_reason, c.stop_reason) for c in out.choices]
            for out in outputs] + [[(out.completion_tokens,)] for out in outputs]


PROMPTS = [[3 + (7 * i + j) % 20 for j in range(5 + i)] for i in range(6)]
SHARED = [[5, 6, 7, 8, 9, 10, 11, 12, 3 + i] for i in range(8)]  # two shared 4-token blocks: prefix-cache hits

CASES: dict[str, tuple[list[list[int]], SamplingParams, int, dict[str, Any]]] = {
    "greedy": (PROMPTS, SamplingParams(temperature=0.0, max_tokens=40), 64, {}),
    "seeded, n=2": (PROMPTS, SamplingParams(temperature=0.8, seed=5, max_tokens=40, n=2), 64, {}),
    "preempted on a small pool": (SHARED, SamplingParams(temperature=0.0, max_tokens=30), 12,
                                  {"max_num_batched_tokens": 16, "max_num_seqs": 4}),
    "stop strings, logprobs": (SHARED, SamplingParams(temperature=0.7, seed=1, max_tokens=30, stop=("k", "mn"),
                                                      logprobs=True, top_logprobs=2), 40, {}),
    "n=3, priority": (SHARED, SamplingParams(temperature=0.0, max_tokens=25, n=3), 40, {"scheduling": "priority"}),
    "top-k, top-p, tight budget": (SHARED, SamplingParams(temperature=1.0, seed=9, max_tokens=25, top_k=5,
                                                          top_p=0.9), 20, {"max_num_batched_tokens": 8}),
    "stop token ids, include_stop_str": (PROMPTS, SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=(9,),
                                                                 stop=("q",), include_stop_str_in_output=True),
                                         64, {}),
}


@pytest.mark.parametrize("case", CASES)
def test_outputs_are_those_without_speculation(case: str) -> None:
    prompts, params, blocks, config = CASES[case]
    plain, _, _ = generate(prompts, params, None, blocks, **config)
    guessed, counters, preempted = generate(prompts, params, NGRAM, blocks, **config)
    assert seen(guessed) == seen(plain)
    assert counters is not None and counters.accepted > 0  # guesses were kept...
    assert counters.proposed > counters.accepted  # ...and rejected
    if case.startswith("preempted"):
        assert preempted > 0


def test_penalised_rows_do_not_guess_and_min_tokens_waits() -> None:
    """A penalty reads the tokens before each position, which guesses would have to stand in for: such rows
    do not guess. min_tokens bans EOS until it is reached: a row guesses only after that."""
    penalised = SamplingParams(temperature=0.0, max_tokens=30, presence_penalty=0.5, frequency_penalty=0.3)
    plain, _, _ = generate(PROMPTS, penalised, None)
    guessed, counters, _ = generate(PROMPTS, penalised, NGRAM)
    assert seen(guessed) == seen(plain) and counters is not None and counters.proposed == 0
    waiting = SamplingParams(temperature=0.0, max_tokens=30, min_tokens=12, ignore_eos=False)
    plain, _, _ = generate(PROMPTS, waiting, None)
    guessed, counters, _ = generate(PROMPTS, waiting, NGRAM)
    assert seen(guessed) == seen(plain) and counters is not None and counters.accepted > 0


def test_a_stop_string_amid_kept_guesses_ends_the_choice_there() -> None:
    """A prompt that already holds the chain's cycle: the first step keeps all its guesses, and the stop string
    ends the text in the middle of them; no token after it is shown or counted."""
    cycle = generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=30), None)[0][0].choices[0]
    stop = cycle.text[4:6]
    params = SamplingParams(temperature=0.0, max_tokens=40, stop=(stop,))
    prompt = PROMPTS[0] + cycle.token_ids
    plain, _, _ = generate([prompt], params, None)
    recorder = Recorder()
    guessed, counters, _ = generate([prompt], params, NGRAM, observer=recorder)
    assert counters is not None and counters.accepted >= 2
    assert seen(guessed) == seen(plain)
    choice = guessed[0].choices[0]
    end = cycle.text.index(stop)  # one letter a token: the text before the stop, then the stop's own tokens
    assert choice.text == cycle.text[:end] and choice.finish_reason == "stop"
    assert guessed[0].completion_tokens == len(choice.token_ids) == end + len(stop)
    assert list(recorder.finished[0].token_ids[0]) == prompt + choice.token_ids  # the engine's list kept none either


def _run_pair(speculative: SpeculativeConfig | None, blocks: int, requests: list[tuple[list[int], int]],
              max_preemptions: int) -> tuple[list[str | None], int]:
    """Two requests; with speculation, the first guesses four copies of its last token every step (mostly
    wrong: guesses that take blocks and are given back). Finish reasons and preemptions."""
    recorder = Recorder()
    llm = LLM(SchedulerConfig(debug_checks=True, max_preemptions=max_preemptions), PagedKVCacheManager(blocks, 4),
              MarkovBackend(), MarkovTokenizer(), max_model_len=256, observer=recorder, speculative=speculative)
    speculator = llm.core.scheduler.speculator
    if speculator is not None:
        speculator.propose = (  # type: ignore[method-assign]
            lambda seq_id, tokens, most, threshold=0.0: [tokens[-1]] * min(4, most) if seq_id == 0 else [])
    streams = [llm.core.add_request(EngineRequest(f"r{i}", tuple(p), SamplingParams(temperature=0.0, max_tokens=n)))
               for i, (p, n) in enumerate(requests)]
    llm.run_until_idle()
    return [s.take_finished().choices[0].finish_reason for s in streams], recorder.count


def test_guesses_never_cost_another_sequence_its_blocks() -> None:
    """When the pool runs short, the guesses already granted go back before anyone is preempted: a pool that
    serves two requests without speculation serves them with it, with no more preemptions (a guess that took
    the last free block once made the other sequence's own token find none)."""
    for prompt_a, prompt_b, blocks in (([3], [12, 13], 5), ([3, 4, 5], [12], 6), ([3, 4], [12, 13, 14], 7)):
        requests = [(prompt_a, 16), (prompt_b, 8)]
        for max_preemptions in (0, 8):
            plain = _run_pair(None, blocks, requests, max_preemptions)
            guessed = _run_pair(NGRAM, blocks, requests, max_preemptions)
            assert guessed[0] == plain[0] and guessed[1] <= plain[1], (prompt_a, prompt_b, blocks, max_preemptions)


def test_keeping_guesses_takes_fewer_steps() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=60)
    llms = [LLM(SchedulerConfig(debug_checks=True), PagedKVCacheManager(64, 4), MarkovBackend(), MarkovTokenizer(),
                max_model_len=256, speculative=spec) for spec in (None, NGRAM)]
    steps = []
    for llm in llms:
        outputs = llm.generate([PROMPTS[0]], params)
        assert outputs[0].completion_tokens == 60
        steps.append(len(llm.backend.steps))  # type: ignore[attr-defined]
    assert steps[1] < 0.6 * steps[0]


def test_a_guessing_step_samples_every_guessed_position() -> None:
    backend = MarkovBackend()
    llm = LLM(SchedulerConfig(debug_checks=True), PagedKVCacheManager(64, 4), backend, MarkovTokenizer(),
              max_model_len=256, speculative=NGRAM)
    llm.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=30))
    guessing = [b for b in backend.steps if b.sample_lag is not None]
    assert guessing
    for batch in guessing:
        assert batch.sample_lag is not None
        lags = batch.sample_lag.tolist()
        assert lags[-1] == 0 and lags == list(range(lags[0], -1, -1))  # one sequence: k..0
        assert batch.num_tokens == len(lags)  # its own token and its guesses, each sampled


def test_sampled_tokens_follow_the_model_distribution() -> None:
    """Many seeded requests at temperature 0.8 with guessing on: the transitions they sample fit the chain's own
    probabilities (chi-square, over every cell expected 5 times or more)."""
    backend = MarkovBackend()
    temperature = 0.8
    prompts = [[3 + i % 20] for i in range(300)]
    counts = np.zeros((VOCAB, VOCAB))
    guessed = SpecCounters("ngram")
    for batch in range(3):
        params = [SamplingParams(temperature=temperature, seed=1000 * batch + i, max_tokens=24) for i in range(100)]
        for prompt, p in zip(prompts[100 * batch : 100 * (batch + 1)], params, strict=True):
            outputs, counters, _ = generate([prompt], p, NGRAM)
            tokens = prompt + outputs[0].choices[0].token_ids
            for a, b in zip(tokens, tokens[1:], strict=False):
                counts[a, b] += 1
            assert counters is not None
            guessed.proposed += counters.proposed
            guessed.accepted += counters.accepted
    assert guessed.accepted > 0 and guessed.proposed > guessed.accepted
    expected = np.array([counts[a].sum() * backend.probabilities(a, temperature) for a in range(VOCAB)])
    cells = expected >= 5
    chi2 = float((((counts - expected) ** 2)[cells] / expected[cells]).sum())
    dof = int(cells.sum()) - int((expected.sum(axis=1) > 0).sum())
    assert chi_square_tail(chi2, dof) > 1e-3


def chi_square_tail(x: float, dof: int) -> float:
    """P(X >= x) for X chi-square with `dof` degrees of freedom (Wilson-Hilferty: within 1e-3 for dof >= 10)."""
    third = 2 / (9 * dof)
    z = ((x / dof) ** (1 / 3) - (1 - third)) / math.sqrt(third)
    return 0.5 * math.erfc(z / math.sqrt(2))


# --- the proposer ------------------------------------------------------------------------------------------


def test_prompt_lookup_proposes_what_followed_the_longest_match() -> None:
    index = NgramIndex(ngram_max=3)
    tokens = [1, 2, 3, 9, 1, 2, 4, 7, 5, 1, 2]
    assert index.propose(tokens, 3) == [4, 7, 5]  # "1 2" last occurred before 4 (longest: "5 1 2" never did)
    tokens += [3]
    assert index.propose(tokens, 2) == [9, 1]  # "1 2 3" matches at the start


def test_prompt_lookup_never_matches_the_suffix_with_itself() -> None:
    index = NgramIndex(ngram_max=4)
    assert index.propose([5], 3) == []
    assert index.propose([5, 6, 7], 3) == []
    assert index.propose([5, 6, 7, 5], 3) == [6, 7, 5]


def test_guesses_are_made_while_worth_their_cost() -> None:
    state = Guessing(NgramIndex(2))  # the prior: half the guesses kept
    assert state.worth(0.0, 4) == 4  # free guesses: all allowed
    assert state.worth(0.3, 4) == 1  # 0.5 >= 0.3 > 0.25
    assert state.worth(0.1, 4) == 3
    assert state.worth(1.0, 4) == 0  # a guess that costs what a token is worth: never
    for step in range(10):
        state.observe(3, 3, step)  # all kept, again and again
    assert state.rate > 0.9 and state.worth(0.5, 4) == 4


def test_guessing_pauses_after_misses_and_the_pause_doubles() -> None:
    state = Guessing(NgramIndex(2))
    for step in range(MISSES_BEFORE_PAUSE):
        state.observe(2, 0, step)
    assert state.paused_until > MISSES_BEFORE_PAUSE - 1
    first_pause = state.pause
    for step in range(100, 100 + MISSES_BEFORE_PAUSE):
        state.observe(1, 0, step)
    assert state.pause == 2 * first_pause  # failing again doubles the pause
    state.observe(2, 1, 200)
    assert state.pause == 0  # a kept guess ends the backoff


def test_a_sequence_below_the_price_probes_where_guesses_are_cheap() -> None:
    """Two early misses must not silence a sequence for good: where a guess is cheap it still makes one (a
    probe), its failures pausing it; where a guess costs nearly a token, it makes none."""
    speculator = Speculator(SpeculativeConfig("ngram"))
    tokens = [5, 6, 7, 5, 6, 7, 5]
    speculator.propose(0, tokens, 3)
    state = speculator._states[0]
    state.kept, state.tried = 0.0, 4.0  # its guesses never kept
    assert state.worth(0.3, 3) == 0
    assert speculator.propose(0, tokens, 3, threshold=0.3) == [6]  # a probe
    assert speculator.propose(0, tokens, 3, threshold=0.9) == []
    for _ in range(MISSES_BEFORE_PAUSE):
        speculator.observe(0, 1, 0)
    assert speculator.propose(0, tokens, 3, threshold=0.3) == []  # paused


def test_a_large_batch_guesses_only_what_is_nearly_sure() -> None:
    """The threshold is a row's cost over a kept token's worth: low alone (the step reads the weights once for
    any few rows), near 1 when many rows share a step and each costs about what the step does per token."""
    cost = CostCoefficients(step=8e-3, token=1.5e-3, sampled=0.2e-3)
    alone = guess_threshold(cost, np.array([True]), np.array([300]))
    crowded = guess_threshold(cost, np.ones(64, bool), np.full(64, 300))
    assert alone < 0.25 < 0.8 < crowded < 1


def test_guesses_fit_what_the_budget_leaves() -> None:
    proposals = Proposals(np.array([3, 0, 4]), {0: [1, 2, 3], 2: [4, 5, 6, 7]})
    assert proposals.fitted(0) is None
    assert proposals.fitted(10) is proposals.lens
    assert proposals.fitted(5).tolist() == [3, 0, 2]  # type: ignore[union-attr]


def test_speculation_settings_are_checked() -> None:
    for bad in ({"speculative_method": "draft"}, {"num_speculative_tokens": 0}, {"ngram_max": 0}):
        with pytest.raises(ValueError):
            SpeculativeConfig(**bad)
    assert not SpeculativeConfig().enabled
