"""Experiments rewrite only their own block of the Experiments section."""

from __future__ import annotations

from pathlib import Path

from bench.experiments.doc import SECTION, cell, table, update_block


def test_blocks_are_created_replaced_and_ordered(tmp_path: Path) -> None:
    doc = tmp_path / "PERF.md"
    doc.write_text("# Performance\n\n## Other\n\nkeep me\n")
    update_block(doc, "frontier", "frontier v1")
    update_block(doc, "batching", "batching v1")
    update_block(doc, "frontier", "frontier v2")
    update_block(doc, "cross-check", "check v1")
    text = doc.read_text()
    assert text.startswith("# Performance\n\n## Other\n\nkeep me\n\n" + SECTION)
    assert "frontier v1" not in text and text.count(SECTION) == 1
    assert text.index("batching v1") < text.index("frontier v2") < text.index("check v1")


def test_a_later_section_stays_after_the_experiments(tmp_path: Path) -> None:
    doc = tmp_path / "PERF.md"
    doc.write_text(f"# P\n\n{SECTION}\n\nintro\n\n## Appendix\n\ntail\n")
    update_block(doc, "kv-layout", "kv v1")
    text = doc.read_text()
    assert text.index("kv v1") < text.index("## Appendix") and text.endswith("tail\n")


def test_table_cells() -> None:
    assert table(("a", "b"), [("x", 1234.5)]) == "| a | b |\n| --- | ---: |\n| x | 1,234 |"
    assert (cell(float("nan")), cell(12.34), cell(1.234)) == ("–", "12.3", "1.23")
