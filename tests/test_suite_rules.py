"""Rules for the tests themselves, checked on their syntax trees: every test function asserts something (itself
or through a helper of tests/ that does), so a hollow test is caught as it is written; and every skip goes
through tests/required.py, which fails a missing tool under CI=true instead of skipping it."""

from __future__ import annotations

from pathlib import Path

from tests.suite_rules import hollow_tests, skips

TESTS = Path(__file__).resolve().parent
SKIP_HELPER = TESTS / "required.py"
# Tests that pass by running a library's checks, which raise on a failure: path from tests/, name, and why.
ALLOWED_HOLLOW = {
    ("service/test_openapi.py", "test_server_keeps_to_its_document"):
        "schemathesis's call_and_validate raises FailureGroup when any of its checks fails",
}


def python_files() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


def test_every_test_asserts() -> None:
    found = hollow_tests(python_files(), TESTS)
    hollow = [f for f in found if (str(f.path.relative_to(TESTS)), f.name) not in ALLOWED_HOLLOW]
    assert not hollow, "tests with no assertion, and no call of a helper that asserts:\n" + "\n".join(map(str, hollow))


def test_the_allowed_hollow_tests_still_exist() -> None:
    for path, name in ALLOWED_HOLLOW:
        assert f"def {name}(" in (TESTS / path).read_text(), (path, name)


def test_every_skip_goes_through_tests_required() -> None:
    found = [f for path in python_files() if path != SKIP_HELPER for f in skips(path)]
    assert not found, "skips outside tests/required.py (use unavailable or hardware_absent):\n" + "\n".join(
        map(str, found))
