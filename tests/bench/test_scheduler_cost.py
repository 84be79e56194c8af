"""The scheduler cost micro-benchmark runs and reports each part."""

from __future__ import annotations

import pytest

from bench import scheduler_cost


@pytest.mark.parametrize("observer", ["null", "records"])
def test_it_runs_small(observer: str, capsys: pytest.CaptureFixture[str]) -> None:
    scheduler_cost.main(["--seqs", "8", "--steps", "20", "--observer", observer])
    out = capsys.readouterr().out
    for part in ("scheduler", "plan", "update", "output processing", "total", "target p99 scheduler"):
        assert part in out
