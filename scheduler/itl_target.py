"""The ITL target in force: the number of ms configured, or, under "auto", one derived from the step-cost model's
prediction for a full decode step, so that a slow host gets a target its own steps can meet.

A fixed 100 ms suits a GPU, whose decode steps take 10-30 ms: prefill has most of the target. On a busy 2-core
CPU a decode step of 16 rows takes about as long as 100 ms alone, so the planner could add no more than the
minimum chunk of prompt beside it: prompts queued behind one another, fewer streams decoded, and that cost up
to a quarter of the throughput and 2-2.7x the TTFT p99 (docs/PERFORMANCE.md, "The auto ITL target"). Scaling
the target with what a decode step costs on this host keeps a share of every step for prefill wherever the
model runs.

The scheduler derives it once, from the model as calibrated at start-up (scheduler/scheduler.py says why not
from its later refits); service/assemble.py logs it and /metrics shows it (`pagedserve:itl_target_seconds`).
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.step_shape import CostCoefficients, StepShape
from scheduler.config import AUTO, SchedulerConfig

FLOOR_MS = 100.0  # the old fixed default: on a fast host, where a decode step is short, nothing changes
# The target is MULTIPLE x a full decode step (max_num_seqs rows). 0.5 is measured: three A/B runs over HTTP
# on a busy 2-core host, 16 streams of 256/128 tokens against no target (docs/PERFORMANCE.md, "The auto ITL
# target"). At 0.5 (targets of 377-673 ms there) ITL p99 was 1.9-2.4x TPOT p50, close under the 2.5x goal, so
# a larger multiple would break it; a smaller one nears the host's own decode step, where 100 ms was: TTFT
# p99 2.0-2.7x, while 0.5 gave 1.0-1.6x and 0.91-0.99x the throughput. The same host quiet calibrates a
# 64-row step under 200 ms, so it keeps the floor, which meets the goals there (0.97x, 1.45x, 2.0x).
MULTIPLE = 0.5
# Tokens of context each row of that step holds: those of the calibration's own decode steps (16-token prompts
# and their first tokens, scheduler/calibration.py). Its per-KV-token cost is fitted on a few hundred KV tokens
# at most, and calibrations on the busy host put it anywhere from 0 to 440 us, which at 512 tokens a row would
# have made the target 4-15 s. So the step is what the calibration measured, extended in rows only; MULTIPLE,
# measured on real loads, covers their longer contexts.
ROW_CONTEXT = 16


@dataclass(frozen=True)
class ItlTarget:
    """The target the scheduler holds steps to, and where it came from."""

    ms: float  # 0: off
    auto: bool = False  # derived from the decode step below
    decode_step_ms: float = 0.0  # auto: the predicted time of a full decode step
    rows: int = 0  # that step's rows (max_num_seqs)
    row_context: int = 0  # and each row's tokens of context

    @property
    def seconds(self) -> float:
        return self.ms / 1e3

    def describe(self) -> str:
        """For the start-up log."""
        if not self.auto:
            return "off (0)" if self.ms == 0 else f"{self.ms:g} ms (as configured)"
        return (f"{self.ms:g} ms (auto: {MULTIPLE:g}x the {self.decode_step_ms:.1f} ms the step-cost model "
                f"predicts for a decode step of {self.rows} rows of {self.row_context} tokens, at least "
                f"{FLOOR_MS:g} ms)")


def resolve_itl_target(config: SchedulerConfig, coefficients: CostCoefficients, max_model_len: int) -> ItlTarget:
    """The configured number, or under "auto" MULTIPLE x a full decode step as `coefficients` predict it,
    rounded to whole ms and at least FLOOR_MS."""
    if config.itl_target_ms != AUTO:
        return ItlTarget(float(config.itl_target_ms))
    rows, context = config.max_num_seqs, max(1, min(ROW_CONTEXT, max_model_len))
    step_ms = 1e3 * decode_step_seconds(coefficients, rows, context)
    return ItlTarget(float(max(FLOOR_MS, round(MULTIPLE * step_ms))), True, step_ms, rows, context)


def decode_step_seconds(coefficients: CostCoefficients, rows: int, row_context: int) -> float:
    """A step that decodes one token for each of `rows` sequences of `row_context` tokens."""
    context = rows * row_context
    return coefficients.seconds(StepShape(rows, rows, context, context))
