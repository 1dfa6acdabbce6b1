"""The comparison benchmark's RESULTS.md rewrite on a real file: only its own section is
replaced. The pure parts: tests/unit/benchmarks/test_bench_report.py.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import report


def test_write_section_replaces_only_its_own_section(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text("# Results\n\n## Faults\nkeep me\n")
    report.write_section(path, f"{report.BEGIN}\nfirst\n{report.END}\n")
    path.write_text(path.read_text() + "\n## Later\nkeep me too\n")
    report.write_section(path, f"{report.BEGIN}\nsecond\n{report.END}\n")
    text = path.read_text()
    assert "keep me\n" in text and "keep me too" in text
    assert "second" in text and "first" not in text
    assert text.count(report.BEGIN) == 1
