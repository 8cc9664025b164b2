"""benchmarks/RESULTS.md is what ``benchmarks/results_md.py`` generates from the result rows
kept as data (``benchmarks/results/*.jsonl``), and a new row lands in both."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import results_md  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)


def test_results_md_is_generated_from_the_data() -> None:
    expected = results_md.summary_markdown()
    assert results_md.PATH.read_text(encoding="utf-8") == expected, (
        "benchmarks/RESULTS.md is out of date: run .venv/bin/python benchmarks/results_md.py"
    )


@pytest.mark.parametrize(
    "path", sorted(results_md.RESULTS_DIR.glob("*.jsonl")), ids=lambda p: p.stem
)
def test_every_row_names_its_run_and_known_columns(path: Path) -> None:
    columns = results_md.COLUMNS[path.stem]
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert records, f"{path} holds no rows"
    for record in records:
        assert record["benchmark"] == path.stem
        assert record["date"], record
        assert set(record) == {"benchmark", "date", "commit", "machine", "load", "values"}
        assert set(record["values"]) <= set(columns), record["values"].keys() - set(columns)


def _chain3_cells(ratio: str) -> list[str]:
    cells = ["2030-01-01 10:00:00", "abc1234", "8x Test CPU", "inline", "n_throughput=10"]
    cells += ["2000.0", "6000.0", "10.0", "12.0", "15.0", "20.0", "0.3 / - / 0.4 / 0.05"]
    cells += ["200.0, 20.0", ratio, "0.50x", "n/a", "n/a"]
    return cells


def test_a_new_row_goes_to_its_data_file_and_into_the_summary(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    summary = tmp_path / "RESULTS.md"
    for name in results_md.COLUMNS:
        source = results_md.RESULTS_DIR / f"{name}.jsonl"
        if source.exists():
            folder.mkdir(exist_ok=True)
            (folder / source.name).write_bytes(source.read_bytes())
    before = len(results_md.read_records("chain3", folder))
    results_md.append_record(
        results_md.make_record("chain3", _chain3_cells("10.00x")), folder, summary
    )
    assert len(results_md.read_records("chain3", folder)) == before + 1
    text = summary.read_text(encoding="utf-8")
    assert "| chain3 inline | wf/s >= 8x Restate | 2000.0 wf/s, 10.00x Restate's " in text
    assert "| 2030-01-01 10:00, abc1234 | **met** |" in text
    assert "| chain3 inline | p50 <= 0.7x Restate | p50 10.0 ms, 0.50x Restate's" in text
    assert "8x Test CPU" in " ".join(text.split())  # in the machines line
    assert "| 2030-01-01 10:00:00 | abc1234 | 8x Test CPU | inline |" in (
        results_md.table_markdown("chain3", folder)
    )


def test_a_target_not_reached_is_not_met(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    results_md.append_record(
        results_md.make_record("chain3", _chain3_cells("2.00x")), folder, tmp_path / "R.md"
    )
    text = (tmp_path / "R.md").read_text(encoding="utf-8")
    assert "| chain3 inline | wf/s >= 8x Restate | 2000.0 wf/s, 2.00x Restate's " in text
    assert "2.00x Restate's | 2030-01-01 10:00, abc1234 | not met |" in text
    assert "| chain3 activities | wf/s >= 3x Restate | not measured yet | | |" in text
