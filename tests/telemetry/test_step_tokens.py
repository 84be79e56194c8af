"""Token records made when read, and skipping the records for an observer that ignores them."""

from __future__ import annotations

from collections.abc import Sequence

from telemetry.interface import NullObserver, StepRecord, StepTokens, TokenRecord, observes_steps


def test_step_tokens_are_the_records_the_engine_used_to_build() -> None:
    tokens = StepTokens(4, 1.5, 3, 20, ["a", "b"], [1, 2], frozenset({"b"}))
    expected = [TokenRecord("a", 4, 1.5, 1, False, 3, 20), TokenRecord("b", 4, 1.5, 2, True, 3, 20)]
    assert len(tokens) == 2 and list(tokens) == expected and tokens[-1] == expected[1]
    assert tokens[1:] == expected[1:]


def test_only_an_observer_that_reads_steps_gets_them_built() -> None:
    class Reader(NullObserver):
        def step_finished(self, step: StepRecord, tokens: Sequence[TokenRecord]) -> None:
            pass

    class Quiet(NullObserver):
        pass

    assert not observes_steps(NullObserver()) and not observes_steps(Quiet())
    assert observes_steps(Reader())
