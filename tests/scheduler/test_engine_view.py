"""The live dashboard's views of the engine (scheduler/engine_view.py), built from a real core over a real pool:
nothing is built while nobody watches; each step's view says what the plan ran and what the pool holds after
it; every request that ends is reported once; the idle view and the snapshot tell the state at rest."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from scheduler import engine_view
from scheduler.core import EngineCore
from scheduler.engine_view import Detail, EngineSnapshot, IdleView, KVCounts, StepView
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.step import SchedulerPlan
from tests.scheduler.engine_helpers import prompt
from tests.scheduler.fake_model import PositionBackend, make_core


@dataclass
class Recorder:
    """A StepWatcher that keeps what it is handed."""

    watching: bool = True
    views: list[tuple[str, object]] = field(default_factory=list)

    def publish(self, event: str, view: object) -> None:
        self.views.append((event, view))

    def steps(self) -> list[StepView]:
        return [v for e, v in self.views if isinstance(v, StepView) and e == "step"]

    def finished(self) -> list[engine_view.FinishedView]:
        return [f for _, v in self.views if isinstance(v, StepView | IdleView) for f in v.finished]


def add(core: EngineCore, rid: str, tokens: tuple[int, ...], max_tokens: int = 6, n: int = 1) -> None:
    core.add_request(EngineRequest(rid, tokens, SamplingParams(temperature=0.0, max_tokens=max_tokens, n=n,
                                                               ignore_eos=True)))


def run_until_idle(core: EngineCore, plans: list[SchedulerPlan] | None = None, abort_at: dict[int, str] | None = None
                   ) -> None:
    """Plan, execute, commit until no work is left, keeping each plan; abort_at: {step number: request id}."""
    backend = PositionBackend()
    for number in range(1000):
        if abort_at and number in abort_at:
            core.abort(abort_at[number])
        if not core.has_work:
            core.views.idle()
            return
        plan = core.plan()
        if plan.batch is not None:
            core.commit(plan, backend.execute(plan.batch), core.clock())
            if plans is not None:
                plans.append(plan)
    pytest.fail("the engine did not go idle")


def test_nothing_is_built_while_nobody_watches(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> KVCounts:
        raise AssertionError("a view was built with nobody watching")

    monkeypatch.setattr(KVCounts, "of", classmethod(refuse))
    core = make_core(64, max_num_batched_tokens=16)
    recorder = Recorder(watching=False)
    core.views.watcher = recorder
    for i in range(3):
        add(core, f"r{i}", prompt(i, 30))
    run_until_idle(core, abort_at={2: "r1"})
    assert recorder.views == []
    assert not core.requests


def test_a_view_that_fails_to_build_harms_no_request(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    def broken(*args: object) -> KVCounts:
        raise RuntimeError("a bug in a view")

    monkeypatch.setattr(KVCounts, "of", classmethod(broken))
    core = make_core(64, max_num_batched_tokens=16)
    recorder = Recorder()
    core.views.watcher = recorder
    for i in range(3):
        add(core, f"r{i}", prompt(i, 30))
    streams = [core.requests[f"r{i}"].stream for i in range(3)]
    run_until_idle(core)
    assert recorder.views == [] and "building the dashboard's view failed" in caplog.text
    outputs = [stream.take_finished() for stream in streams]
    assert all(out.error is None and out.completion_tokens == 6 for out in outputs)
    assert core.kv.stats().used_blocks == 0


def test_each_step_view_is_its_plan_and_the_pool_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_view, "DETAIL_INTERVAL_S", 0.0)  # a detail with every step
    core = make_core(64, max_num_batched_tokens=16)  # 30-token prompts: prefilled in chunks beside decodes
    recorder = Recorder()
    core.views.watcher = recorder
    for i in range(3):
        add(core, f"r{i}", prompt(i, 30))
    plans: list[SchedulerPlan] = []
    run_until_idle(core, plans)
    steps = recorder.steps()
    assert [v.step for v in steps] == [p.step_id for p in plans]
    for view, plan in zip(steps, plans, strict=True):
        rows = view.rows
        assert (rows.id, rows.choice, rows.tokens) == ([s.request_id for s in plan.seqs], [s.index for s in plan.seqs],
                                                       plan.counts.tolist())
        assert [p == "p" for p in rows.phase] == [i in plan.prefill for i in range(len(plan.seqs))]
        assert rows.context == (plan.starts + plan.counts).tolist()
        assert (view.prefill_tokens, view.decode_tokens) == (plan.prefill_tokens, plan.decode_tokens)
        assert view.kv.used + view.kv.free == view.kv.total == 64
        assert view.detail is not None and view.kv.used == sum(view.detail.map.count(c) for c in "us")
        for blocks in view.detail.tables.values():  # a running request's blocks are in use
            assert all(view.detail.map[b] in "us" for b in blocks)
        assert set(view.detail.tables) == {s.request_id for s in core.scheduler.running} or view is not steps[-1]
    assert {p for v in steps for p in v.rows.phase} == {"p", "d"}
    assert any(v.prefill_tokens and v.decode_tokens for v in steps)  # a mixed step was seen
    assert steps[-1].kv.used == 0  # every request ended in the last step and its blocks went back


def test_the_kv_view_counts_what_the_pool_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_view, "DETAIL_INTERVAL_S", 0.0)
    core = make_core(64)
    recorder = Recorder()
    core.views.watcher = recorder
    shared = prompt(0, 24)
    add(core, "a", shared, max_tokens=20)
    add(core, "b", shared, max_tokens=20)  # the same prompt: its full blocks come from the prefix cache
    add(core, "c", prompt(1, 9), max_tokens=20, n=3)  # three choices share the prompt's blocks
    backend = PositionBackend()
    for _ in range(8):
        plan = core.plan()
        assert plan.batch is not None
        core.commit(plan, backend.execute(plan.batch), core.clock())
        step, stats = recorder.steps()[-1], core.kv.stats()
        assert step.detail is not None
        counts, states = step.kv, step.detail.map
        assert (counts.used, counts.free, counts.cached, counts.total) == (stats.used_blocks, stats.free_blocks,
                                                                            stats.cached_free_blocks, stats.num_blocks)
        assert (states.count("u") + states.count("s"), states.count("c"), len(states)) == (
            counts.used, counts.cached, counts.total)
        assert step.detail.shared == states.count("s") == core.stats().kv_shared_blocks
        assert sorted({b for blocks in step.detail.tables.values() for b in blocks}) == \
            [b for b, state in enumerate(states) if state in "us"]  # the tables cover exactly the used blocks
    assert recorder.steps()[-1].detail.shared >= 2  # type: ignore[union-attr]  # a and b's prompt, c's choices


def test_every_request_that_ends_is_reported_once_with_its_reason() -> None:
    core = make_core(64, max_num_batched_tokens=16)
    recorder = Recorder()
    core.views.watcher = recorder
    for i in range(4):
        add(core, f"r{i}", prompt(i, 12), max_tokens=5)
    run_until_idle(core, abort_at={3: "r2"})
    finished = {f.id: f for f in recorder.finished()}
    assert len(recorder.finished()) == len(finished) == 4
    assert finished["r2"].reason == "abort"
    for rid in ("r0", "r1", "r3"):
        done = finished[rid]
        assert (done.reason, done.prompt_tokens, done.completion_tokens, done.error) == ("length", 12, 5, None)
        assert done.ttft_ms is not None and done.ttft_ms >= 0


def test_the_idle_view_reports_the_resting_pool_once() -> None:
    core = make_core(64, max_num_batched_tokens=16)
    recorder = Recorder()
    core.views.watcher = recorder
    add(core, "r0", prompt(0, 30))
    backend = PositionBackend()
    plan = core.plan()
    core.commit(plan, backend.execute(plan.batch), core.clock())  # type: ignore[arg-type]
    core.abort("r0")  # between steps: only an idle view can tell
    core.views.idle()
    core.views.idle()  # nothing changed since: nothing more
    idle = [v for e, v in recorder.views if e == "idle"]
    assert len(idle) == 1 and isinstance(idle[0], IdleView)
    assert [f.id for f in idle[0].finished] == ["r0"]
    assert (idle[0].kv.used, idle[0].running, idle[0].waiting, idle[0].detail.tables) == (0, 0, 0, {})
    # the first 16-token chunk filled 4 blocks of 4, published in the prefix cache
    assert idle[0].kv.cached == idle[0].detail.map.count("c") == 4


def test_the_snapshot_shows_every_request_in_flight_and_the_queue() -> None:
    core = make_core(64, max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(4):
        add(core, f"r{i}", prompt(i, 10))
    backend = PositionBackend()
    plan = core.plan()
    core.commit(plan, backend.execute(plan.batch), core.clock())  # type: ignore[arg-type]
    snapshot = core.views.snapshot()
    assert isinstance(snapshot, EngineSnapshot)
    assert [(lane.id, lane.state) for lane in snapshot.requests] == [("r0", "decode"), ("r1", "decode"),
                                                                       ("r2", "queued"), ("r3", "queued")]
    detail = snapshot.detail
    assert {rid: len(blocks) for rid, blocks in detail.tables.items()} == {"r0": 3, "r1": 3}  # 10 tokens, blocks of 4
    assert [e.id for e in detail.queue] == ["r2", "r3"] and detail.queue_more == 0 and detail.preempted == 0
    assert (snapshot.running, snapshot.waiting, snapshot.step, snapshot.block_size) == (2, 2, plan.step_id, 4)
    assert snapshot.kv.used == 6 and isinstance(detail, Detail)


def test_the_detail_comes_at_most_every_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(engine_view.time, "monotonic", lambda: clock[0])
    core = make_core(64)
    recorder = Recorder()
    core.views.watcher = recorder
    add(core, "r0", prompt(0, 8), max_tokens=10)
    backend = PositionBackend()
    for advance in (0.0, 0.05, 0.04, 0.02, 0.0, 0.2):
        clock[0] += advance
        plan = core.plan()
        core.commit(plan, backend.execute(plan.batch), core.clock())  # type: ignore[arg-type]
    assert [v.detail is not None for v in recorder.steps()] == [True, False, False, True, False, True]
    core.views.idle()  # the last step carried a detail, and nothing changed since: no idle view
    plan = core.plan()
    core.commit(plan, backend.execute(plan.batch), core.clock())  # type: ignore[arg-type]
    assert recorder.steps()[-1].detail is None
    core.views.idle()  # the page's block map is a step old: the idle view brings it up to date
    assert [e for e, _ in recorder.views].count("idle") == 1
