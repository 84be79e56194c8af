"""Inter-token latency attribution: the judge and classifier, then whole scenarios on the sim backend (virtual
clock, cpu cost profile) where the cause of a slow token is known by construction."""

from __future__ import annotations

import random
import statistics

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from backends.model.loader import ModelFiles
from scheduler.params import SamplingParams
from telemetry.itl import GapJudge, RunningMedian, TokenGap, classify
from telemetry.tracker import RequestState
from tests.telemetry.test_tracing import finish, request_span, traced


def slow_events(span: ReadableSpan) -> list[dict[str, object]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == "slow_token"]


def slow_count(render: bytes, cause: str) -> float:
    line = f'pagedserve:slow_token_total{{cause="{cause}"}} '.encode()
    (value,) = [row[len(line):] for row in render.splitlines() if row.startswith(line)]
    return float(value)


def test_running_median_matches_statistics() -> None:
    rng = random.Random(7)
    median, values = RunningMedian(), []
    for _ in range(301):
        values.append(rng.expovariate(1.0))
        median.add(values[-1])
        assert median.value == pytest.approx(statistics.median(values))


@pytest.mark.parametrize(("gap", "cause"), [
    (TokenGap(1.0, 0.1, 0.9, 0, True), "preemption"),
    (TokenGap(1.0, 0.8, 0.2, 512, False), "queue"),
    (TokenGap(1.0, 0.0, 1.0, 512, False), "prefill_interference"),
    (TokenGap(1.0, 0.0, 1.0, 512, False, guessed_tokens=6), "prefill_interference"),
    (TokenGap(1.0, 0.0, 1.0, 0, False, guessed_tokens=6), "speculation"),
    (TokenGap(1.0, 0.0, 1.0, 0, False), "slow_step"),
])
def test_classify(gap: TokenGap, cause: str) -> None:
    assert classify(gap) == cause


def test_judge_needs_history_and_uses_the_median_before_the_gap() -> None:
    judge = GapJudge(factor=2.0, min_gaps=3)
    assert judge.judge(0.5, 0.0, 0.5, 64, False) is None  # no history yet
    judge = GapJudge(factor=2.0, min_gaps=3)
    for _ in range(3):
        assert judge.judge(0.1, 0.0, 0.1, 0, False) is None
    verdict = judge.judge(0.5, 0.0, 0.5, 64, False)
    assert verdict is not None and verdict.cause == "prefill_interference"
    assert verdict.median == pytest.approx(0.1) and verdict.threshold == pytest.approx(0.2)
    assert judge.judge(0.19, 0.0, 0.19, 0, False) is None  # under 2 x median


def test_long_prompt_arriving_mid_decode_is_prefill_interference(files: ModelFiles) -> None:
    rig, telemetry, exporter = traced(files)
    rig.submit("decoder", 16, 20)
    for _ in range(6):  # its prefill, then 5 decode steps: 5 normal gaps
        rig.step()
    rig.submit("long-prompt", 400, 2, seed=1)  # shares the next step with the decode
    rig.step()
    shared = rig.tee.steps[-1]
    assert shared.prefill_tokens == 400 and "decoder" in shared.request_ids
    rig.run()
    spans = finish(telemetry, exporter)
    span = request_span(spans, "decoder")
    (slow,) = slow_events(span)
    assert slow["pagedserve.slow_token.cause"] == "prefill_interference"
    assert slow["pagedserve.step.id"] == shared.step_id and slow["pagedserve.token.index"] == 6
    assert slow["pagedserve.step.prefill_tokens"] == 400
    assert slow["pagedserve.token.gap_s"] > 2 * slow["pagedserve.slow_token.median_gap_s"]  # type: ignore[operator]
    token = [e for e in span.events if e.name == "token" and e.attributes["pagedserve.token.index"] == 6]
    assert token[0].attributes["pagedserve.slow_token.cause"] == "prefill_interference"
    assert span.attributes["pagedserve.slow_tokens.prefill_interference"] == 1
    assert slow_count(telemetry.render(), "prefill_interference") == 1
    assert slow_count(telemetry.render(), "preemption") == 0


def test_preempted_request_gap_is_preemption(files: ModelFiles) -> None:
    # 6 blocks of 16: two 40-token prompts fill 3 blocks each; at position 48 the first needs a 7th block
    # and the second (admitted last) is preempted, waits for the first to finish, and is recomputed.
    rig, telemetry, exporter = traced(files, num_blocks=6, max_model_len=96)
    rig.submit("first", 40, 12)
    rig.submit("second", 40, 12, seed=1)
    outs = rig.run()
    assert sum(s.preemptions for s in rig.tee.steps) == 1
    assert all(len(o.choices[0].token_ids) == 12 for o in outs.values())
    spans = finish(telemetry, exporter)
    second = request_span(spans, "second")
    causes = [e["pagedserve.slow_token.cause"] for e in slow_events(second)]
    assert causes == ["preemption"]
    assert second.attributes["pagedserve.preemptions"] == 1
    assert [e.name for e in second.events if e.name == "preempted"] == ["preempted"]
    queues = [s for s in spans if s.name == "llm.request.queue" and s.parent is not None
              and s.parent.span_id == second.context.span_id]
    assert sorted(bool(q.attributes["pagedserve.requeue"]) for q in queues) == [False, True]
    recompute = [s for s in spans if s.name == "llm.request.prefill" and s.attributes["pagedserve.prefill.recompute"]]
    assert len(recompute) == 1
    assert slow_count(telemetry.render(), "preemption") == 1
    assert b"pagedserve:num_preemptions_total 1.0" in telemetry.render()


def test_decoder_sitting_out_steps_is_queue(files: ModelFiles) -> None:
    # Priority scheduling with a 64-token budget: a higher-priority long prompt joins the running batch ahead
    # of three decoders, and its full chunks take the whole budget, so the decoders sit out three steps.
    rig, telemetry, exporter = traced(files, scheduling="priority", max_num_batched_tokens=64, itl_target_ms=0)
    for i in range(3):
        rig.submit(f"d{i}", 8, 20, seed=i, priority=1)
    for _ in range(6):
        rig.step()
    rig.submit("urgent", 61 + 3 * 64 + 10, 1, seed=9, priority=0)
    rig.run()
    skipped = [s for s in rig.tee.steps if s.request_ids == ("urgent",)]
    assert len(skipped) == 3
    spans = finish(telemetry, exporter)
    for i in range(3):
        # first the step shared with the prompt's first chunk, then the token after the three steps sat out
        shared, slow = slow_events(request_span(spans, f"d{i}"))
        assert shared["pagedserve.slow_token.cause"] == "prefill_interference"
        assert slow["pagedserve.slow_token.cause"] == "queue"
        assert slow["pagedserve.slow_token.wait_s"] > slow["pagedserve.step.duration_s"]  # type: ignore[operator]
    assert slow_count(telemetry.render(), "queue") == 3


@pytest.mark.parametrize(("n", "tokens", "first_step", "per_choice"), [
    (1, 9, 1, 8),  # 9 tokens: 8 after the first, whether in 8 steps or in 3 that kept guesses (per token)
    (1, 9, 3, 6),  # a first step that kept two guesses
    (2, 10, 2, 4),  # two choices, 5 tokens each
])
def test_tpot_divides_by_the_tokens_after_the_first_step_per_choice(n: int, tokens: int, first_step: int,
                                                                    per_choice: float) -> None:
    state = RequestState("r", 0.0, 4, SamplingParams(n=n), None, GapJudge(2.0, 3))  # type: ignore[arg-type]
    state.tokens, state.first_step_tokens = tokens, first_step
    assert state.later_tokens_per_choice == per_choice

