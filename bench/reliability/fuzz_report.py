"""Tallies of a fuzz run, its targets, and the summary printed at the end."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from bench.reliability.fuzz_canary import CanaryLog
from bench.reliability.fuzz_cases import Case
from bench.reliability.fuzz_client import (
    BAD_SUCCESS,
    ERROR_BODY,
    NO_ANSWER,
    SERVER_ERROR,
    UNEXPECTED,
    Answer,
    Problem,
)
from bench.reliability.fuzz_wire import Exchange
from bench.reliability.protocol_cases import ProtocolCase

MIN_PROTOCOL_CASES = 100
SHOWN_BYTES = 300
# (what must hold, the problem category that breaks it) for the generated cases.
GENERATED_TARGETS = (
    ("no 5xx", SERVER_ERROR),
    ("every error is OpenAI error JSON", ERROR_BODY),
    ("every 200 is the route's shape, every stream ends with [DONE]", BAD_SUCCESS),
    ("valid ones served, invalid ones refused", UNEXPECTED),
    ("every one answered", NO_ANSWER),
)


@dataclass
class Tally:
    """The generated cases: counts, and the first few that broke a rule, rendered for the report."""

    show: int = 5
    routes: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    problems: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def add(self, case: Case, answer: Answer, found: list[Problem]) -> None:
        self.routes[case.route] += 1
        self.kinds[case.kind] += 1
        self.statuses[str(answer.status) if answer.status is not None else "none"] += 1
        self.problems.update({p.category for p in found})
        if found and len(self.examples) < self.show:
            self.examples.append(_generated_example(case, answer, found))

    @property
    def sent(self) -> int:
        return sum(self.routes.values())


@dataclass
class ProtocolTally:
    statuses: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[ProtocolCase, Exchange, list[str]]] = field(default_factory=list)
    sent: int = 0

    def add(self, case: ProtocolCase, result: Exchange, found: list[str]) -> None:
        self.sent += 1
        self.statuses.update(str(r.status) for r in result.responses)
        self.statuses.update([result.ending] if len(result.responses) < case.answers else [])
        if found:
            self.failures.append((case, result, found))


@dataclass(frozen=True)
class Summary:
    target: str  # the server, in words
    seed: int
    generated: Tally
    protocol: ProtocolTally | None  # None: not run
    canary: CanaryLog
    final_state: dict[str, float]
    tracebacks: Counter[str] | None  # in the server's log, by exception; None: no log to read

    def targets(self) -> list[tuple[str, bool]]:
        """(target, held); the protocol and log targets only when there were protocol cases and a log."""
        found = [(f"generated cases: {name}", self.generated.problems[category] == 0)
                 for name, category in GENERATED_TARGETS]
        if self.protocol is not None:
            found.append((f"protocol cases: at least {MIN_PROTOCOL_CASES}, every one passed",
                          self.protocol.sent >= MIN_PROTOCOL_CASES and not self.protocol.failures))
        found += [("canary: checked, identical every time", self.canary.checks > 1 and not self.canary.mismatches),
                  ("final state: nothing running or waiting, no KV block used",
                   all(v == 0 for v in self.final_state.values()))]
        return found + ([] if self.tracebacks is None else [("server log: no Traceback", not self.tracebacks)])

    @property
    def passed(self) -> bool:
        return all(ok for _, ok in self.targets())


def render(summary: Summary) -> str:
    sections = (_header, _generated, _protocol, _canary, _state, _targets, _examples)
    return "\n".join(line for section in sections for line in section(summary))


def _header(s: Summary) -> list[str]:
    return [f"fuzz run against {s.target}, seed {s.seed}"]


def _generated(s: Summary) -> list[str]:
    g = s.generated
    lines = [f"generated cases: {g.sent}"]
    lines += [f"  {route:<32} {n:>6}" for route, n in sorted(g.routes.items())]
    lines.append("  by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(g.kinds.items())))
    lines.append("  statuses: " + _histogram(g.statuses))
    for _, category in GENERATED_TARGETS:
        lines.append(f"  {category + ':':<20} {g.problems[category]}")
    return lines


def _protocol(s: Summary) -> list[str]:
    p = s.protocol
    if p is None:
        return ["protocol cases: not run"]
    return [f"protocol cases: {p.sent}, {p.sent - len(p.failures)} passed, {len(p.failures)} failed",
            "  answers: " + _histogram(p.statuses)]


def _canary(s: Summary) -> list[str]:
    c = s.canary
    return [f"canary: {c.checks} checks, {len(c.mismatches)} mismatches (reference {c.reference!r})"]


def _state(s: Summary) -> list[str]:
    state = ", ".join(f"{k} {v:g}" for k, v in s.final_state.items())
    log = "not read (not our server)" if s.tracebacks is None else f"{s.tracebacks.total()} Traceback(s)"
    if s.tracebacks:
        log += ": " + ", ".join(f"{kind} x{n}" for kind, n in s.tracebacks.most_common())
    return [f"final state: {state}", f"server log: {log}"]


def _targets(s: Summary) -> list[str]:
    lines = ["targets:"] + [f"  {'PASS' if ok else 'FAIL'}  {name}" for name, ok in s.targets()]
    return lines + [f"result: {'PASS' if s.passed else 'FAIL'}"]


def _examples(s: Summary) -> list[str]:
    lines = []
    if s.generated.examples:
        lines += ["", f"first offending generated cases (the same --seed {s.seed} sends them again):",
                  *s.generated.examples]
    if s.protocol is not None and s.protocol.failures:
        lines += ["", "failed protocol cases:"]
        lines += [_protocol_example(c, r, f) for c, r, f in s.protocol.failures]
    if s.canary.mismatches:
        lines += ["", "canary mismatches:", *(f"  {m}" for m in s.canary.mismatches[:s.generated.show])]
    return lines


def _histogram(counts: Counter[str]) -> str:
    return ", ".join(f"{k}: {n}" for k, n in sorted(counts.items()))


def _generated_example(case: Case, answer: Answer, found: list[Problem]) -> str:
    sent = _shown(case.body) if case.body is not None else "(no body)"
    got = (f"{answer.status} {answer.content_type or '(no Content-Type)'} {_shown(answer.body)}"
           if answer.status is not None else answer.failure)
    return (f"  case {case.index} ({case.kind}, expected {case.expect.value}): {case.method} {case.path[:120]}\n"
            f"    sent:     {sent}\n    answered: {got}\n"
            f"    problems: {'; '.join(f'{p.category}: {p.detail}' for p in found)}")


def _protocol_example(case: ProtocolCase, result: Exchange, found: list[str]) -> str:
    answers = "; ".join(f"{r.status_line} {_shown(r.body, 160)}" for r in result.responses) or "(none)"
    return (f"  {case.name}: sent {_shown(b''.join(case.parts), 160)}\n    answered: {answers} [{result.ending}]\n"
            f"    problems: {'; '.join(found)}")


def _shown(data: bytes, limit: int = SHOWN_BYTES) -> str:
    more = f" … ({len(data)} bytes)" if len(data) > limit else ""
    return repr(data[:limit]) + more
