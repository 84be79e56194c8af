"""The ITL target in force: the number of ms configured, or, under "auto", a limit each step sets from its own
decode part and the prompts waiting, so that a slow host and a burst of newcomers both get a target they can meet.

A fixed 100 ms suits a GPU, whose decode steps take 10-30 ms: prefill has most of the target. On a 2-core CPU a
decode step of 16 rows takes 60-100 ms alone, so the planner could add little more than the minimum chunk of
prompt beside it: prompts queued behind one another, and at 16 streams that cost up to a quarter of the
throughput and 1.7-6x the TTFT p99 of no target (docs/PERFORMANCE.md, "The auto ITL target"). "auto" lets a
step that prefills beside decoding sequences take DECODE_MULTIPLE x what its decode part alone is predicted to
take (at least the floor): each decoding stream's gap is then a bounded multiple of its usual one, whatever
the host's speed, the batch or the load of the moment (the decode part is priced by the refitted model, on
the shape it sees most). The multiple then stretches by (prompts waiting + sequences decoding) / sequences
decoding, and the floor by prompts waiting / sequences decoding when prompts outnumber streams: a waiting
prompt's first token weighs as much as a decoding stream's next one, so in a burst (every stream of a closed
loop starting together) the few streams already decoding do not hold the many back, while one newcomer among
15 streams lengthens their step by a fifteenth.

The scheduler asks limit_seconds() at each step that prefills beside decodes; service/app/assemble.py logs the rule
and /metrics shows the limit of the latest such step (`pagedserve:itl_target_seconds`).
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.step_shape import CostCoefficients, StepShape
from scheduler.config import AUTO, SchedulerConfig

FLOOR_MS = 100.0  # the old fixed default: on a fast host, where a decode step is short, nothing changes
# Under "auto" a step that prefills beside decoding sequences may take DECODE_MULTIPLE x its decode part's
# predicted time (at least the floor): every decoding stream's gap is then at most that multiple of a plain
# decode step's, which is the goal's own measure (ITL p99 at most 2.5x TPOT p50), with room for the fit's error.
DECODE_MULTIPLE = 2.0
# The log's example of what the rule gives: a decode step of max_num_seqs rows of the calibration's own context
# (16-token prompts and their first tokens, scheduler/calibration.py).
ROW_CONTEXT = 16


@dataclass(frozen=True)
class ItlTarget:
    """The target the scheduler holds steps to: a configured number, or under "auto" a rule, with the full
    decode step predicted at start-up for the log."""

    ms: float  # 0: off; under "auto", the floor
    auto: bool = False  # derived, step by step, from the step's decode part and the prompts waiting
    decode_step_ms: float = 0.0  # auto: the start-up prediction of a full decode step (for the log)
    rows: int = 0  # that step's rows (max_num_seqs)
    row_context: int = 0  # and each row's tokens of context

    @property
    def seconds(self) -> float:
        return self.ms / 1e3

    def limit_seconds(self, decode_s: float, decoding: int, prefilling: int) -> float:
        """How long a step that decodes `decoding` rows (their part predicted at `decode_s`) may take while
        `prefilling` prompts wait for all or part of theirs. A configured number is that number. "auto" is
        DECODE_MULTIPLE x the decode part times (prefilling + decoding) / decoding, and at least the floor times
        prefilling / decoding where that is over 1: each waiting prompt's first token weighs as much as a
        decoding stream's next one, so a burst of newcomers is not spread over steps sized for the few streams
        already decoding, while one newcomer among many streams stretches the step by little. The floor is
        stretched only when prompts outnumber streams: on a GPU, where it is many decode parts long, a stretch
        for every newcomer would only lengthen the streams' gaps (on the sim H100: ITL p99 129 ms against 97,
        for the same TTFT and throughput)."""
        if not self.auto:
            return self.seconds
        waiting = prefilling / max(1, decoding)
        return max(self.seconds * max(1.0, waiting), DECODE_MULTIPLE * decode_s * (1.0 + waiting))

    def describe(self) -> str:
        """For the start-up log."""
        if not self.auto:
            return "off (0)" if self.ms == 0 else f"{self.ms:g} ms (as configured)"
        full = max(self.ms, DECODE_MULTIPLE * self.decode_step_ms)
        return (f"auto: a step that prefills beside decoding sequences may take {DECODE_MULTIPLE:g}x its decode "
                f"part's predicted time times (prompts waiting + sequences decoding) / sequences decoding, at "
                f"least {self.ms:g} ms times prompts waiting / sequences decoding where that is over 1 ({full:.0f} "
                f"ms before those factors with {self.rows} rows of {self.row_context} tokens decoding, whose step "
                f"the start-up calibration predicts at {self.decode_step_ms:.1f} ms)")


def resolve_itl_target(config: SchedulerConfig, coefficients: CostCoefficients, max_model_len: int) -> ItlTarget:
    """The configured number, or "auto"'s rule with the full decode step that `coefficients` predict."""
    if config.itl_target_ms != AUTO:
        return ItlTarget(float(config.itl_target_ms))
    rows, context = config.max_num_seqs, max(1, min(ROW_CONTEXT, max_model_len))
    return ItlTarget(FLOOR_MS, True, 1e3 * decode_step_seconds(coefficients, rows, context), rows, context)


def decode_step_seconds(coefficients: CostCoefficients, rows: int, row_context: int) -> float:
    """A step that decodes one token for each of `rows` sequences of `row_context` tokens."""
    context = rows * row_context
    return coefficients.seconds(StepShape(rows, rows, context, context))
