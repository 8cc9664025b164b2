"""benchmarks/RESULTS.md is what ``benchmarks/results_md.py`` generates from the result rows
kept as data (``benchmarks/results/*.jsonl``), and a new row lands in both."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import results_cluster  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import results_md  # noqa: E402


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
    assert "| chain3 inline | p50 <= 0.8x Restate | p50 10.0 ms, 0.50x Restate's" in text
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
    assert "2.00x Restate's | 2030-01-01 10:00, abc1234 | not met: two cores shared" in text
    assert "](../docs/explanation/performance/chain3.md#what-limits-the-targets)) |" in text
    assert "| chain3 activities | wf/s >= 3x Restate | not measured yet | | |" in text


def _chain3_result(variant: str, wf_s: float, p50: float, p99: float) -> dict[str, Any]:
    """A chain3 result as ``chain3.run`` returns it (the fields the rows read)."""
    cpu = {"processor": 0.3, "client": 0.05, "machine": 1.2}
    cpu |= {"broker-1": 0.2, "broker-2": 0.1, "broker-3": 0.15}
    return {
        "variant": variant,
        "brokers": 3,
        "replication_factor": 3,
        "min_insync_replicas": 2,
        "commit": "abc1234",
        "host": {"date_utc": "2030-01-01T10:00:00Z", "cpu": "Test CPU", "cores": 8,
                 "ram_gib": 16.0, "kernel": "6.1", "python": "3.11.9"},
        "params": {"n_throughput": 300, "n_latency": 50, "repeats": 1, "partitions": 8},
        "median": {"workflows_per_s": wf_s, "activities_per_s": wf_s * 3, "p50_ms": p50,
                   "p90_ms": p50 + 1, "p99_ms": p99, "max_ms": p99 + 5,
                   "cpu_ms_per_workflow_throughput": cpu},
    }  # fmt: skip


def _add_cluster_row(folder: Path, summary: Path, single: dict[str, Any] | None) -> None:
    result = _chain3_result("inline", 500.0, 20.0, 40.0)
    cells = results_cluster.cluster_cells(result, "n_throughput=300", single)
    record = results_md.make_record(
        "chain3-cluster", ["2030-01-01 10:00:00", "abc1234", "8x Test CPU", *cells]
    )
    results_md.append_record(record, folder, summary)


def test_a_cluster_row_sits_beside_the_single_broker_with_its_ratios(tmp_path: Path) -> None:
    folder, summary = tmp_path / "results", tmp_path / "RESULTS.md"
    _add_cluster_row(folder, summary, _chain3_result("inline", 1000.0, 10.0, 20.0))
    (row,) = results_md.read_records("chain3-cluster", folder)
    values = row["values"]
    assert (values["brokers"], values["replication factor"], values["min.insync.replicas"]) == (
        "3",
        "3",
        "2",
    )
    assert (
        values["CPU ms/wf (tp): processor / worker / brokers / client"] == "0.3 / - / 0.45 / 0.05"
    )
    assert values["CPU ms/wf (tp) per broker"] == "0.2 / 0.1 / 0.15"
    assert values["1 broker, same run: wf/s, p50 ms, p99 ms"] == "1000.0, 10.0, 20.0"
    text = summary.read_text(encoding="utf-8")
    assert (
        "| chain3 inline on a local cluster | 500.0 wf/s, p50 20.0 ms, p99 40.0 ms on 3 brokers "
        "(replication factor 3, min.insync.replicas 2); 0.50x / 2.00x / 2.00x the single "
        "broker's (same run) | 2030-01-01 10:00, abc1234 |"
    ) in text
    assert "| chain3 activities on a local cluster | not measured yet | |" in text
    # the cluster's readings come first, right under the header of the table without a target
    readings = text.split("| without a target | newest | run (UTC, commit) |\n|---|---|---|\n")[1]
    assert readings.startswith("| chain3 inline on a local cluster |")


def test_a_cluster_row_without_a_single_broker_run_has_no_ratios(tmp_path: Path) -> None:
    folder, summary = tmp_path / "results", tmp_path / "RESULTS.md"
    _add_cluster_row(folder, summary, None)
    (row,) = results_md.read_records("chain3-cluster", folder)
    assert row["values"]["vs 1 broker: wf/s"] == "n/a"
    assert "min.insync.replicas 2); no single-broker run beside it |" in summary.read_text(
        encoding="utf-8"
    )
