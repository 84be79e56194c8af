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


def test_guided_rows_guess_within_their_grammar(files: ModelFiles, guides: GuideFactory) -> None:
    """With speculation, a guided row's guesses are cut where its grammar refuses them, and each guessed
    position is masked as the grammar stands after the guesses before it: a guided answer and its unguided
    neighbour's are those without guessing. The guesses come from an oracle that knows those answers and
    spoils every third guess with a token no JSON here allows."""
    guided = SamplingParams(max_tokens=30, seed=11, guide=guides.compile("json_schema", SCHEMA, "x"))
    plain = SamplingParams(max_tokens=24, temperature=0.0)
    prompts = {0: prompt(10), 1: prompt(3)}  # seq ids, in the order the requests are added
    spoiler = files.tokenizer.encode("Q")[0]
    answers: dict[int, list[int]] = {}
    kept: dict[int, int] = {0: 0, 1: 0}
    offered: dict[int, list[int]] = {}  # each sequence's latest guesses, before any cut

    def oracle(seq_id: int, tokens: list[int], most: int, threshold: float = 0.0) -> list[int]:
        done = len(tokens) - len(prompts[seq_id])
        right = answers[seq_id][done : done + most]
        offered[seq_id] = [spoiler if (done + j) % 3 == 2 else t for j, t in enumerate(right)]
        return offered[seq_id]

    def verified(seq_id: int, proposed: int, accepted: int) -> None:
        cut = offered[seq_id].index(spoiler) if spoiler in offered[seq_id] else proposed
        assert seq_id == 1 or proposed <= cut  # the guided row's run ends before the refused token
        kept[seq_id] += accepted

    for speculative in (None, SpeculativeConfig("ngram", num_speculative_tokens=4)):
        llm = make_llm(files, guides, speculative=speculative)
        speculator = llm.core.scheduler.speculator
        if speculator is not None:
            speculator.propose = oracle  # type: ignore[method-assign]
            speculator.observe = verified  # type: ignore[method-assign]
        streams = [llm.core.add_request(_request("g", prompts[0], guided)),
                   llm.core.add_request(_request("p", prompts[1], plain))]
        llm.run_until_idle()
        choices = [s.take_finished().choices[0] for s in streams]
        if speculator is None:
            answers = {0: choices[0].token_ids, 1: choices[1].token_ids}
    assert choices[0].token_ids == answers[0] and choices[1].token_ids == answers[1]
    assert json.loads(choices[0].text)["tag"] in ("a", "b")
    assert kept[0] > 0 and kept[1] > 0  # both rows kept guesses


def test_a_grammar_accepts_a_guess_run_up_to_its_first_refused_token(files: ModelFiles,
                                                                    guides: GuideFactory) -> None:
    guide = guides.guide(guides.compile("regex", r"[0-9]{3}-[0-9]{4}", "guided_regex"))
    digits = files.tokenizer.encode("123")
    letter = files.tokenizer.encode("Q")
    assert guide.allowed_run(digits) == len(digits)
    assert guide.allowed_run(digits + letter + digits) == len(digits)
    assert guide.allowed_run(letter) == 0
    moved = guide.after(digits)
    assert guide.allowed_run(letter) == 0 and moved.allowed_run(files.tokenizer.encode("-")) == 1
    assert guide.allowed_run(files.tokenizer.encode("-")) == 0  # the original did not move


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
