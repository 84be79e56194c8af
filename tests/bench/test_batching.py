"""bench/batching.py's drivers: closed-loop clients keep exactly `concurrency` requests in the engine, open
loop sends by arrival time, and both policies run the same work to the end on the simulated backend."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from backends.model.loader import open_model
from bench.batching import WORKLOADS, Job, Submitter, make_jobs, sim_results
from scheduler.request import EngineRequest


@dataclass
class FakeCore:
    sent: list[EngineRequest] = field(default_factory=list)

    def add_request(self, request: EngineRequest) -> None:
        self.sent.append(request)


def jobs(arrivals: list[float]) -> list[Job]:
    return [Job(a, (1, 2, 3), 4) for a in arrivals]


def test_closed_loop_replaces_each_finished_request_at_once() -> None:
    core, clock = FakeCore(), [10.0]
    submitter = Submitter(core, jobs([0.0] * 7), clients=3, now=lambda: clock[0])  # type: ignore[arg-type]
    assert [r.arrival_time for r in core.sent] == [10.0] * 3
    clock[0] = 12.5
    submitter.due(2)
    assert [r.arrival_time for r in core.sent[3:]] == [12.5, 12.5]
    submitter.due(0)
    assert len(core.sent) == 5
    submitter.due(3)  # only two jobs are left
    assert len(core.sent) == 7 and not submitter.pending
    assert len({r.request_id for r in core.sent}) == 7
    with pytest.raises(RuntimeError, match="closed loop"):  # an idle engine would wait forever
        submitter.next_arrival()


def test_open_loop_sends_by_arrival_time() -> None:
    core, clock = FakeCore(), [100.0]
    submitter = Submitter(core, jobs([0.0, 0.5, 2.0]), clients=0, now=lambda: clock[0])  # type: ignore[arg-type]
    assert core.sent == []
    submitter.due(0)
    assert [r.arrival_time for r in core.sent] == [100.0]
    clock[0] = 101.0
    submitter.due(5)  # finished requests do not matter in open loop
    assert [r.arrival_time for r in core.sent] == [100.0, 100.5] and submitter.next_arrival() == 102.0


@pytest.mark.parametrize("closed_loop", [True, False])
def test_both_policies_finish_the_same_work(closed_loop: bool) -> None:
    files = open_model()[1]
    workload = WORKLOADS["chat"][0]
    work = make_jobs(workload.__class__(**{**workload.__dict__, "count": 24}), seed=1)
    static, continuous, *_ = sim_results(files, "cpu", work, concurrency=4, closed_loop=closed_loop)
    expected = sum(j.max_tokens for j in work)
    assert static.output_tokens == continuous.output_tokens == expected
    assert len(static.ttft) == len(continuous.ttft) == 24
    assert continuous.steps < static.steps and continuous.mean_batch > static.mean_batch
    assert max(static.mean_batch, continuous.mean_batch) <= 4
    assert continuous.throughput > static.throughput  # same tokens in a shorter makespan
