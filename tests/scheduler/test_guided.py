"""Constrained decoding in the engine: grammars compile or are refused with a reason, every token of a guided
sequence follows its grammar whatever else shares the batch, and unguided sequences are untouched."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import llguidance
import llguidance.numpy as llg_numpy
import numpy as np
import pytest

from backends.model.loader import ModelFiles, open_model
from backends.sampling import allowed_matrix
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig, SpeculativeConfig
from scheduler.errors import InvalidRequestError
from scheduler.guided import GuideFactory
from scheduler.llm import LLM
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.sequence import SequenceStatus
from telemetry.interface import NullObserver
from tests.scheduler.engine_helpers import prompt
from tests.sim_backend.helpers import backend as sim_backend

# Finite, so that the sim backend's random walk through it always ends.
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["a", "b"]}},
          "required": ["ok", "tag"], "additionalProperties": False}


@pytest.fixture(scope="module")
def files() -> ModelFiles:
    return open_model()[1]


@pytest.fixture(scope="module")
def guides(files: ModelFiles) -> Iterator[GuideFactory]:
    factory = GuideFactory(files.tokenizer)
    yield factory
    factory.close()


class Preemptions(NullObserver):
    def __init__(self) -> None:
        self.count = 0

    def request_preempted(self, request_id: str, now: float) -> None:
        self.count += 1


def make_llm(files: ModelFiles, guides: GuideFactory | None, blocks: int = 256,
             observer: NullObserver | None = None, speculative: SpeculativeConfig | None = None) -> LLM:
    sim = sim_backend(files)
    sim.init_cache(blocks, 16)
    return LLM(SchedulerConfig(), PagedKVCacheManager(blocks, 16), sim, files.tokenizer, max_model_len=2048,
               guides=guides, observer=observer, speculative=speculative)


@pytest.mark.parametrize(("kind", "value", "says"), [
    ("regex", "a(b", "unclosed group"),
    ("json_schema", {"type": "frob"}, "frob"),
    ("json_schema", [1, 2], "must be an object"),
    ("choice", [], "non-empty list"),
    ("choice", ["ok", 3], "non-empty list"),
    ("lark", "start: missing_rule", "missing_rule"),
    ("regex", "", "non-empty"),
])
def test_a_bad_constraint_is_refused_naming_the_problem(guides: GuideFactory, kind: str, value: object,
                                                        says: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        guides.compile(kind, value, "guided_x")  # type: ignore[arg-type]
    assert says in str(info.value) and info.value.param == "guided_x"


def test_a_huge_grammar_is_refused_before_compiling(guides: GuideFactory) -> None:
    with pytest.raises(InvalidRequestError, match="longer than"):
        guides.compile("regex", "a" * 100_000, "guided_regex")


def test_the_mask_is_llguidances_own(guides: GuideFactory, files: ModelFiles) -> None:
    """The step's mask thread computes what a matcher alone computes, for each guide at its own place."""
    spec = guides.compile("json_schema", SCHEMA, "x")
    first, second = guides.guide(spec), guides.guide(spec)
    second.consume(files.tokenizer.encode('{"')[0])  # now inside the first key
    masks = guides.masks([first, second], np.array([3, 5], np.int32))
    assert masks.positions.tolist() == [3, 5]
    bits = masks.bits()  # waits: a guide is used by one thread at a time
    for row, guide in enumerate((first, second)):
        alone = llg_numpy.allocate_token_bitmask(1, guides.vocab_size)
        llg_numpy.fill_next_token_bitmask(guide.matcher, alone)
        np.testing.assert_array_equal(bits[row], alone[0])
    assert allowed_matrix(np, bits, guides.vocab_size)[0].sum() == 1  # only '{"' may open the object


def test_a_guided_sequence_follows_its_grammar_on_random_tokens(files: ModelFiles, guides: GuideFactory) -> None:
    """The sim backend draws pseudo-random allowed tokens: the text still matches, and it ends when the
    grammar does (finish_reason stop, not length)."""
    llm = make_llm(files, guides)
    spec = guides.compile("regex", r"[0-9]{3}-[0-9]{4}", "guided_regex")
    outs = llm.generate([list(prompt(i)) for i in range(4)], SamplingParams(max_tokens=50, guide=spec))
    for out in outs:
        choice = out.choices[0]
        assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", choice.text), choice.text
        assert choice.finish_reason == "stop"


def test_with_speculation_guided_rows_do_not_guess_and_their_neighbours_do(files: ModelFiles,
                                                                             guides: GuideFactory) -> None:
    """A grammar's mask at each position would depend on the guesses before it: guided rows do not guess, and
    keep their grammar; unguided rows beside them guess, their tokens those they get without guessing."""
    guided = SamplingParams(max_tokens=30, seed=11, guide=guides.compile("json_schema", SCHEMA, "x"))
    plain = SamplingParams(max_tokens=24, temperature=0.0)
    outputs, asked = [], []

    def guess(seq_id: int, tokens: list[int], most: int, threshold: float = 0.0) -> list[int]:
        asked.append(seq_id)  # the sim's tokens are pseudo-random: guess the last one again, mostly wrong
        return [tokens[-1]] * min(2, most)

    for speculative in (None, SpeculativeConfig("ngram")):
        llm = make_llm(files, guides, speculative=speculative)
        if llm.core.scheduler.speculator is not None:
            llm.core.scheduler.speculator.propose = guess  # type: ignore[method-assign]
        streams = [llm.core.add_request(_request("g", prompt(10), guided)),
                   llm.core.add_request(_request("p", prompt(3), plain))]
        llm.run_until_idle()
        outputs.append([s.take_finished().choices[0] for s in streams])
    guided_seq, plain_seq = 0, 1  # seq ids, in the order added
    assert asked and guided_seq not in asked and plain_seq in asked
    (guided_alone, plain_alone), (guided_now, plain_now) = outputs
    assert plain_now.token_ids == plain_alone.token_ids
    assert guided_now.token_ids == guided_alone.token_ids and json.loads(guided_now.text)["tag"] in ("a", "b")


def test_choices_and_sampled_rows_each_follow_their_own_grammar(files: ModelFiles, guides: GuideFactory) -> None:
    llm = make_llm(files, guides)
    spec = guides.compile("choice", ["red", "green", "blue"], "guided_choice")
    out = llm.generate([list(prompt(0))], SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=8, guide=spec))[0]
    assert len(out.choices) == 4
    assert all(c.text in ("red", "green", "blue") and c.finish_reason == "stop" for c in out.choices)


def test_unguided_neighbours_get_the_tokens_they_get_alone(files: ModelFiles, guides: GuideFactory) -> None:
    """A grammar masks its own row only: the other rows of the batch are the same as without it."""
    params = SamplingParams(max_tokens=12, temperature=0.9, seed=3)
    alone = make_llm(files, guides).generate([list(prompt(1)), list(prompt(2))], params)
    llm = make_llm(files, guides)
    guided = SamplingParams(max_tokens=30, guide=guides.compile("json_schema", SCHEMA, "x"))
    streams = [llm.core.add_request(_request(f"g{i}", prompt(10 + i), guided)) for i in range(2)]
    plain = [llm.core.add_request(_request(f"p{i}", prompt(1 + i), params)) for i in range(2)]
    llm.run_until_idle()
    together = [s.take_finished() for s in plain]
    for a, b in zip(alone, together, strict=True):
        assert a.choices[0].token_ids == b.choices[0].token_ids
    for stream in streams:
        text = stream.take_finished().choices[0].text
        value = json.loads(text)
        assert isinstance(value["ok"], bool) and value["tag"] in ("a", "b") and set(value) == {"ok", "tag"}


def test_a_preempted_guided_sequence_keeps_its_place(files: ModelFiles, guides: GuideFactory) -> None:
    """Preemption recomputes the KV of the tokens so far; the grammar does not restart."""
    observer = Preemptions()
    llm = make_llm(files, guides, blocks=12, observer=observer)  # the prompts fill every block
    spec = guides.compile("regex", r"x{40}y", "guided_regex")
    outs = llm.generate([list(prompt(i, 64)) for i in range(3)], SamplingParams(max_tokens=60, guide=spec))
    assert observer.count > 0
    for out in outs:
        assert out.choices[0].text == "x" * 40 + "y"


def test_without_a_factory_a_guided_request_is_refused(files: ModelFiles, guides: GuideFactory) -> None:
    llm = make_llm(files, None)
    spec = guides.compile("regex", "a+", "guided_regex")
    with pytest.raises(InvalidRequestError, match="not available"):
        llm.generate([list(prompt(0))], SamplingParams(guide=spec))
    assert not llm.core.requests and not llm.core.scheduler.waiting


def test_a_sequence_leaving_its_grammar_is_stopped(files: ModelFiles, guides: GuideFactory) -> None:
    """Only a backend that ignores the mask can leave the grammar; the sequence then stops there."""
    guide = guides.guide(guides.compile("regex", "ab", "x"))
    assert guide.consume(files.tokenizer.encode("z")[0]) is True
    assert guide.error is not None
    assert SequenceStatus.FINISHED_STOPPED.finish_reason == "stop"


def _request(request_id: str, ids: tuple[int, ...], params: SamplingParams) -> EngineRequest:
    return EngineRequest(request_id, ids, params)


def test_llguidance_tokenizer_spells_tokens_as_the_model_does(files: ModelFiles, guides: GuideFactory) -> None:
    ids = files.tokenizer.encode('{"name": "Zoë", "n": 12}')
    assert guides.tokenizer.decode_bytes(ids) == b"".join(files.tokenizer.token_bytes[i] for i in ids)
    assert isinstance(guides.tokenizer, llguidance.LLTokenizer)


def test_min_tokens_never_bans_the_end_a_grammar_requires(files: ModelFiles, guides: GuideFactory) -> None:
    """Banning EOS until min_tokens, once a grammar allows only EOS, would leave a row with no token: a
    guided sequence's end is its grammar's."""
    llm = make_llm(files, guides)
    spec = guides.compile("choice", ["yes", "no"], "guided_choice")
    llm.core.add_request(_request("g", prompt(0), SamplingParams(min_tokens=5, max_tokens=10, guide=spec)))
    while llm.core.has_work:
        plan = llm.core.plan()
        assert plan.batch is not None and plan.batch.sampling is not None
        assert plan.batch.sampling.suppressed_token_ids is None
        llm.core.commit(plan, llm.backend.execute(plan.batch), llm.core.clock())
