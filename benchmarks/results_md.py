"""Benchmark results: the rows as data, and ``benchmarks/RESULTS.md`` generated from them.

Every run adds one record per result row to ``benchmarks/results/<benchmark>.jsonl`` (one
JSON object a line, oldest first): the date (UTC), the commit, the machine, the machine's
load when the benchmark records it, and the row's other columns as ``values``, each cell
as the text the table shows. ``RESULTS.md`` is then written again from all the files: one
screen of the newest numbers against the performance targets, met or not. The analyses
of what limits each number live in ``docs/explanation/performance/``.

    .venv/bin/python benchmarks/results_md.py               # write RESULTS.md again
    .venv/bin/python benchmarks/results_md.py --check       # exit 1 if it is out of date
    .venv/bin/python benchmarks/results_md.py --table scale # every row of one benchmark

Tables without a script that appends to them (metrics overhead, observability overhead,
idle, activities, cluster faults) take a record added by hand, with the same fields.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import machine_line
from results_cluster import cluster_cells, cluster_shown
from results_columns import COLUMNS, median_cells
from results_targets import TARGETS, Record, Target, variant_is

HERE = Path(__file__).resolve().parent
PATH = HERE / "RESULTS.md"
RESULTS_DIR = HERE / "results"
NOTES = "../docs/explanation/performance"


#: Which column holds each of a record's own fields.
FIELDS = {
    "date (UTC)": "date",
    "date": "date",
    "commit": "commit",
    "commit (before -> after)": "commit",
    "machine": "machine",
    "load avg 1/5/15": "load",
    "load avg (1/5/15 min)": "load",
    "load avg": "load",
}


# --- the data files ---------------------------------------------------------------------


def _cell(value: Any) -> str:
    return "n/a" if value is None else str(value).replace("|", "/")


def make_record(benchmark: str, cells: list[Any]) -> Record:
    """The record of one row whose cells are in ``COLUMNS[benchmark]``'s order."""
    record: Record = {"benchmark": benchmark, "date": None, "commit": None, "machine": None}
    record["load"] = None
    values: dict[str, str] = {}
    for column, value in zip(COLUMNS[benchmark], cells, strict=True):
        if column in FIELDS:
            record[FIELDS[column]] = _cell(value)
        else:
            values[column] = _cell(value)
    record["values"] = values
    return record


def read_records(benchmark: str, folder: Path = RESULTS_DIR) -> list[Record]:
    path = folder / f"{benchmark}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def append_record(record: Record, folder: Path = RESULTS_DIR, summary: Path = PATH) -> None:
    """Add ``record`` to its benchmark's file and write the summary again."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{record['benchmark']}.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
    summary.write_text(summary_markdown(folder), encoding="utf-8")


def _add(benchmark: str, cells: list[Any]) -> None:
    append_record(make_record(benchmark, cells))


def table_markdown(benchmark: str, folder: Path = RESULTS_DIR) -> str:
    """Every row of one benchmark as a Markdown table, oldest first."""
    columns = COLUMNS[benchmark]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for record in read_records(benchmark, folder):
        cells = [record[FIELDS[c]] if c in FIELDS else record["values"].get(c, "") for c in columns]
        while cells and cells[-1] == "":
            cells.pop()
        lines.append("| " + " | ".join("" if c is None else c for c in cells) + " |")
    return "\n".join(lines) + "\n"


# --- the rows each benchmark script adds ---------------------------------------------------


def _date(result: dict[str, Any]) -> str:
    return str(result["host"]["date_utc"]).replace("T", " ").rstrip("Z")


def _params(params: dict[str, Any], keys: tuple[str, ...]) -> str:
    return ", ".join(f"{k}={params[k]}" for k in keys if k in params)


def _cpu_cell(cpu: dict[str, float], names: tuple[str, ...]) -> str:
    return " / ".join(str(cpu.get(n, "-")) for n in names)


def _ratio(ours: float | None, theirs: float | None) -> str | None:
    if not ours or not theirs:
        return None
    return f"{ours / theirs:.2f}x"


def _machine(host: dict[str, Any]) -> str:
    return machine_line(host)


CHAIN3_PARAMS = ("n_throughput", "n_latency", "repeats", "warmup", "partitions", "pin")


def add_chain3(
    result: dict[str, Any], peer: dict[str, Any] | None, comparison: dict[str, Any] | None = None
) -> None:
    """``peer``: the Restate median measured in the same run, if any; ``comparison``: the
    ratios to every peer of the variant and the targets (``peers.ratios``)."""
    med = result["median"]
    cpu = med.get("cpu_ms_per_workflow_throughput", {})
    params = _params(result["params"], CHAIN3_PARAMS)
    theirs = peer or {}
    peer_cell = (
        f"{theirs.get('workflows_per_s')}, {theirs.get('p50_ms')}" if peer is not None else None
    )
    cells = [
        _date(result),
        result["commit"],
        _machine(result["host"]),
        result["variant"],
        params,
        *median_cells(med),
        _cpu_cell(cpu, ("processor", "worker", "broker", "client")),
        peer_cell,
        _ratio(med.get("workflows_per_s"), theirs.get("workflows_per_s")),
        # p50 ratio: ours / theirs, so below 1 means lower (better) latency
        _ratio(med.get("p50_ms"), theirs.get("p50_ms")),
        *_comparison_cells(comparison),
    ]
    _add("chain3", cells)


def add_chain3_cluster(result: dict[str, Any], single: dict[str, Any] | None) -> None:
    """A chain3 variant on a cluster; ``single``: its single-broker result of the same run."""
    cells = cluster_cells(result, _params(result["params"], CHAIN3_PARAMS), single)
    _add("chain3-cluster", [_date(result), result["commit"], _machine(result["host"]), *cells])


def _comparison_cells(comparison: dict[str, Any] | None) -> list[str | None]:
    """The ratios to the peers other than the baseline, and each target met or not met."""
    if comparison is None:
        return [None, None]
    others = [
        f"{stem} {_x(vs['workflows_per_s_ratio'])}, {_x(vs['p50_ratio'])}"
        for stem, vs in comparison["vs"].items()
        if stem != comparison.get("baseline")
    ]
    targets = [
        f"{label}: {t['verdict']} ({_x(t['ratio'])})" for label, t in comparison["targets"].items()
    ]
    return ["; ".join(others) or None, "; ".join(targets) or None]


def _x(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def add_restart(result: dict[str, Any]) -> None:
    med = result["median"]
    cells = [
        _date(result),
        result["commit"],
        _machine(result["host"]),
        "on" if result["static"] else "off",
        _params(result["params"], ("repeats", "partitions")),
        med.get("first_turn_s"),
        med.get("max_first_turn_s"),
        med.get("up_s"),
        med.get("assigned_s"),
        med.get("handover_s"),
    ]
    _add("restart", cells)


def add_failover(result: dict[str, Any]) -> None:
    cells = [
        _date(result),
        result["commit"],
        _machine(result["host"]),
        " / ".join(str(x) for x in result["load_avg"]),
        result["case"],
        _params(result["params"], ("instances", "partitions", "every_ms")),
        f"{result['resumed_p50_s']} / {result['resumed_max_s']}",
        f"{result['others_longest_gap_s']} ({result['others_gap_before_s']})",
        result["takeover_restored_records"],
        result.get("takeover_restore_s", ""),
        result.get("prefill_s", ""),
    ]
    _add("failover", cells)


def add_fanout(result: dict[str, Any]) -> None:
    med = result["median"]
    cpu = med.get("cpu_s", {})
    cells = [
        _date(result),
        result["commit"],
        _machine(result["host"]),
        _params(result["params"], ("n", "repeats", "partitions", "worker_concurrency")),
        med.get("wall_s"),
        med.get("activities_per_s"),
        _cpu_cell(cpu, ("processor", "worker", "broker", "client")),
    ]
    _add("fanout", cells)


def add_fanout_turns(result: dict[str, Any]) -> None:
    start, end = result["start"], result["end"]
    cells = [
        _date(result),
        result["commit"],
        _machine(result["host"]),
        _params(result["params"], ("n", "chunk", "window", "pace_ms", "partitions")),
        f"{result['open_at_start']} / {result['open_at_end']}",
        f"{start['turns']} / {end['turns']}",
        f"{start['processor_cpu_ms_per_turn']} / {end['processor_cpu_ms_per_turn']}",
        f"{result['start_over_end']}x",
        f"{start['wall_s']} / {end['wall_s']}",
        result["wall_s"],
    ]
    _add("fanout-turns", cells)


def add_replay(result: dict[str, Any]) -> None:
    for workload in result["workloads"]:
        cells = [
            _date(result),
            result["commit"],
            _machine(result["host"]),
            workload["workload"],
            workload["history_events"],
            _best(workload, "executor"),
            _best(workload, "decode"),
            _best(workload, "decode_replay"),
        ]
        _add("replay", cells)


def add_replay_ab(result: dict[str, Any]) -> None:
    """Rows of ``replay_ab.py``: the same workloads before and after, from one run."""
    for w in result["workloads"]:

        def pair(measure: str, clock: str = "cpu", w: dict[str, Any] = w) -> str:
            return f"{w[f'before_{measure}_{clock}_ev_s']} / {w[f'after_{measure}_{clock}_ev_s']}"

        cells = [
            _date(result),
            f"{result['base_commit']} -> {result['commit']}",
            _machine(result["host"]),
            " / ".join(str(x) for x in result["load_average"]),
            result["params"]["rounds"],
            w["workload"],
            w["history_events"],
            pair("executor"),
            pair("decode"),
            f"{pair('decode_replay')} ({w['decode_replay_cpu_ratio']}x)",
            pair("decode_replay", "wall"),
        ]
        _add("replay_ab", cells)


def _best(workload: dict[str, Any], name: str) -> str:
    """Median events/s with the best run in brackets: on a shared machine the best run is
    the one least disturbed by other work, the median the one to expect."""
    return f"{workload.get(name + '_events_per_s')} ({workload.get(name + '_best_events_per_s')})"


def add_restore(result: dict[str, Any]) -> None:
    cpu = result["cpu_s"]
    cache = result["cache"]
    rss = result["rss_mib"]
    restored = rss["restored"]
    per_instance = (cache["rss_full_mib"] - restored) * 1024 / max(cache["cached"], 1)
    cells = [
        _date(result),
        result["commit"],
        _machine(result["host"]),
        " / ".join(str(x) for x in result["load_avg"]),
        _params(result["params"], ("instances", "partitions", "stepped", "cache_instances")),
        result["records"],
        result["restore_s"],
        result["instances_per_s"],
        f"{result['replica_cpu_s']} / {cpu.get('broker', '-')} / {cpu.get('machine', '-')}",
        f"{restored} / {cache['rss_full_mib']} / {cache['rss_after_twice_mib']}",
        cache["cached"],
        round(per_instance, 2),
    ]
    _add("restore-replica", cells)


def add_peers(peers: list[dict[str, Any]], host: dict[str, Any]) -> None:
    for peer in peers:
        med = peer.get("median", {})
        cells = [
            str(peer.get("host", host).get("date_utc", "")).replace("T", " ").rstrip("Z"),
            _machine(host),
            f"{peer.get('peer')} / {peer.get('variant')}",
            med.get("workflows_per_s"),
            med.get("activities_per_s"),
            med.get("p50_ms"),
            med.get("p99_ms"),
            _params(peer.get("params", {}), ("n_throughput", "n_latency", "repeats", "warmup")),
        ]
        _add("peers", cells)


def add_scale(result: dict[str, Any]) -> None:
    """One row per (variant, layout); ratios are to 8 partitions x 1 replica, same run."""
    params = _params(result["params"], ("rounds", "n_throughput", "n_latency", "warmup", "pin"))
    for entry in result["rows"]:
        med = entry["median"]
        cpu = med["cpu_ms_per_workflow_throughput"]
        phases = ("step", "produce", "offsets", "commit")
        cells = [
            _date(result),
            result["commit"],
            _machine(result["host"]),
            result["load_average"],
            entry["variant"],
            f"{entry['partitions']} x {entry['replicas']}",
            params,
            med["workflows_per_s"],
            f"{entry['ratio_wf_s']:.2f}x",
            med["p50_ms"],
            f"{entry['ratio_p50']:.2f}x",
            _cpu_cell(cpu, ("processors", "worker", "broker", "client")),
            med["transactions_per_s"],
            med["records_in_per_tx"],
            med["records_out_per_tx"],
            " / ".join(str(med[f"{p}_ms_per_tx"]) for p in phases),
        ]
        _add("scale", cells)


#: The segments of one turn's floor, in the order of the chain3-floor table's columns.
FLOOR_SEGMENTS = (
    "client_produce",
    "fetch_wakeup",
    "turn",
    "txn_produce",
    "txn_send_offsets",
    "txn_commit",
    "status_read",
)


def add_floor(result: dict[str, Any]) -> None:
    """One ``chain3_floor.py`` run: the mean ms per instance of each segment (medians)."""
    med = result["median"]
    segments = med["segments_ms"]
    cells = [
        _date(result),
        result["commit"],
        _machine(result["host"]),
        _params(result["params"], ("n", "repeats", "warmup", "partitions", "kafka")),
        med.get("p50_ms"),
        med.get("total_mean_ms"),
        *(segments.get(k) for k in FLOOR_SEGMENTS),
        med.get("transactions_per_instance"),
    ]
    _add("chain3-floor", cells)


# --- the summary -----------------------------------------------------------------------------


def _newest(records: Iterable[Record]) -> Record | None:
    """The newest record (dates are ISO text, so they sort as they read)."""
    return max(records, key=lambda r: r["date"] or "", default=None)


def _run_cell(record: Record) -> str:
    commit = f", {record['commit']}" if record.get("commit") else ""
    return f"{(record['date'] or '')[:16]}{commit}"


def _newest_of(
    names: tuple[str, ...], qualifies: Callable[[Record], bool], folder: Path
) -> Record | None:
    return _newest(r for name in names for r in read_records(name, folder) if qualifies(r))


def _target_row(target: Target, folder: Path) -> str:
    newest = _newest_of(target.benchmarks or (target.benchmark,), target.qualifies, folder)
    if newest is None:
        return f"| {target.label} | {target.target} | not measured yet | | |"
    measured = target.measure(newest)
    assert measured is not None, (target.label, newest)
    met = measured <= target.limit if target.at_most else measured >= target.limit
    verdict = "**met**" if met else f"not met: {target.limits}" if target.limits else "not met"
    return (
        f"| {target.label} | {target.target} | {target.shown(newest)} | {_run_cell(newest)} "
        f"| {verdict} |"
    )


@dataclass(frozen=True)
class Reading:
    """A benchmark without a target: its newest run, in one cell."""

    benchmark: str
    label: str
    qualifies: Callable[[Record], bool]
    shown: Callable[[Record], str]


def _failover_instances(record: Record) -> str:
    """The instances in state of a failover row, from its params cell ("instances=N, ...")."""
    params = dict(p.split("=", 1) for p in record["values"]["params"].split(", "))
    return f"{int(params['instances']):,}"


READINGS: tuple[Reading, ...] = (
    *(Reading("chain3-cluster", f"chain3 {v} on a local cluster", variant_is(v), cluster_shown)
      for v in ("inline", "activities")),
    Reading(
        "large-payloads", "a large payload's round trip (input, activity, output)",
        lambda r: True,
        lambda r: (
            f"{r['values']['round trip s (median)']} s for {r['values']['payload']} "
            f"({r['values']['MB/s moved']} MB/s of payloads moved)"
        ),
    ),
    Reading(
        "restart", "restart to first turn (static membership)",
        lambda r: r["values"].get("static membership") == "on",
        lambda r: (
            f"{r['values']['restart-to-first-turn s (median)']} s; clean-stop handover "
            f"{r['values']['clean-stop handover s']} s"
        ),
    ),
    Reading(
        "failover", "failover: SIGKILL of a replica to its partitions' next turn",
        lambda r: r["values"].get("case") == "SIGKILL, liveness",
        lambda r: (
            f"{r['values']['resumed s: p50 / max']} s (p50 / max over its partitions) with "
            f"{_failover_instances(r)} instances in state; the takeover restored "
            f"{r['values']['changelog records the takeover restored']} changelog records"
        ),
    ),
    Reading(
        "failover", "failover with a standby replica: SIGKILL to the partitions' next turn",
        lambda r: r["values"].get("case") == "SIGKILL, liveness, standby",
        lambda r: (
            f"{r['values']['resumed s: p50 / max']} s (p50 / max) with "
            f"{_failover_instances(r)} instances in state; the takeover restored "
            f"{r['values']['changelog records the takeover restored']} changelog records"
        ),
    ),
    Reading(
        "fanout", "fan-out of 1,000 activities", lambda r: True,
        lambda r: f"{r['values']['wall s (median)']} s, {r['values']['activities/s']} activities/s",
    ),
    Reading(
        "fanout-turns", "one turn of a fan-out of 100,000 activities, start / end of it",
        lambda r: True,
        lambda r: (
            f"{r['values']['processor CPU ms per turn: start / end']} ms of processor CPU "
            f"({r['values']['start / end']}; 1.0x is flat)"
        ),
    ),
    Reading(
        "chain3-floor", "one inline workflow, start to result", lambda r: True,
        lambda r: (
            f"p50 {r['values']['p50 ms']} ms; transaction {r['values']['txn send_offsets']} "
            f"+ {r['values']['txn commit']} ms of the mean {r['values']['mean ms']} ms"
        ),
    ),
    Reading(
        "peers", "Restate workflow (peer)",
        lambda r: r["values"].get("peer / variant") == "restate / workflow",
        lambda r: f"{r['values']['wf/s']} wf/s, p50 {r['values']['p50 ms']} ms",
    ),
    Reading(
        "cluster-faults", "3-broker cluster: longest pause",
        lambda r: True,
        lambda r: (
            f"{r['values']['SIGKILL the busiest leader s']} s (leader killed), "
            f"{r['values']['restart it s']} s (restarted), "
            f"{r['values']['rolling restart, broker 1 / 2 / 3 s']} s (rolling restart)"
        ),
    ),
)  # fmt: skip


def _reading_row(reading: Reading, folder: Path) -> str:
    newest = _newest(r for r in read_records(reading.benchmark, folder) if reading.qualifies(r))
    if newest is None:
        return f"| {reading.label} | not measured yet | |"
    return f"| {reading.label} | {reading.shown(newest)} | {_run_cell(newest)} |"


def _machines(folder: Path) -> list[str]:
    """The machines of the runs the summary shows."""
    shown = [_newest_of(t.benchmarks or (t.benchmark,), t.qualifies, folder) for t in TARGETS]
    shown += [_newest_of((r.benchmark,), r.qualifies, folder) for r in READINGS]
    return sorted({r["machine"] for r in shown if r is not None and r.get("machine")})


def summary_markdown(folder: Path = RESULTS_DIR) -> str:
    """RESULTS.md: the newest numbers against the targets, generated from the data files."""
    benchmarks = sorted(p.stem for p in folder.glob("*.jsonl"))
    rows = sum(len(read_records(name, folder)) for name in benchmarks)
    machines = "; ".join(_machines(folder))
    lines = [
        "# Benchmark results",
        "",
        "<!-- Generated by benchmarks/results_md.py from benchmarks/results/*.jsonl:"
        " do not edit by hand. -->",
        "",
        "The newest run of each benchmark against the performance targets. The reference",
        "machine has 2 cores shared by the broker, the engine and the client (and often other",
        "work), so compare runs of the same day and peers only as ratios measured in one run.",
        f"What limits each number, and the dated analyses: [Performance]({NOTES}/index.md).",
        "",
        "| benchmark | target | newest | run (UTC, commit) | met, or what limits it |",
        "|---|---|---|---|---|",
        *(_target_row(t, folder) for t in TARGETS),
        "",
        "| without a target | newest | run (UTC, commit) |",
        "|---|---|---|",
        *(_reading_row(r, folder) for r in READINGS),
        "",
        *textwrap.wrap(f"Machines of these runs: {machines}.", 90),
        "",
        f"Every row ever recorded ({rows} in all) is in `benchmarks/results/<benchmark>.jsonl`,",
        "one JSON object a line: date, commit, machine, load, and the row's values;",
        "`.venv/bin/python benchmarks/results_md.py --table NAME` prints one benchmark's rows",
        "as a table. `benchmarks/run_all.py` runs the benchmarks, adds their rows and writes",
        "this page again.",
        *textwrap.wrap("Benchmarks: " + ", ".join(benchmarks) + ".", 90, break_on_hyphens=False),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if RESULTS.md is stale")
    parser.add_argument("--table", metavar="BENCHMARK", help="print one benchmark's rows")
    args = parser.parse_args(argv)
    if args.table:
        print(table_markdown(args.table), end="")
        return 0
    text = summary_markdown()
    if args.check:
        if PATH.read_text(encoding="utf-8") != text:
            print(f"{PATH} is not what the data gives; run {__file__}", file=sys.stderr)
            return 1
        return 0
    PATH.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
