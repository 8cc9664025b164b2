"""Append result rows to ``benchmarks/RESULTS.md``, one table per benchmark.

Rows go above a ``<!-- rows:NAME -->`` marker at the end of each table, so the file stays
readable as a history (newest row last) and every row carries what is needed to compare it
honestly: date, machine, commit and parameters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common import machine_line

PATH = Path(__file__).resolve().parent / "RESULTS.md"

HEADERS = {
    "chain3": "| date (UTC) | commit | machine | variant | params | wf/s | act/s | p50 ms "
    "| p90 ms | p99 ms | max ms | CPU ms/wf (tp): processor / worker / broker / client "
    "| Restate wf/s, p50 ms | ratio wf/s | ratio p50 | ratios to the other peers (wf/s, p50) "
    "| issue 18 targets |\n"
    "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---|---|",
    "fanout": "| date (UTC) | commit | machine | params | wall s (median) | activities/s "
    "| CPU s: processor / worker / broker / client |\n"
    "|---|---|---|---|---:|---:|---|",
    "fanout-turns": "| date (UTC) | commit | machine | params | open activities: start / end "
    "| turns measured: start / end | processor CPU ms per turn: start / end "
    "| start / end | window wall s: start / end | total wall s |\n"
    "|---|---|---|---|---|---|---|---:|---|---:|",
    "replay": "| date (UTC) | commit | machine | workload | events | executor only ev/s "
    "| decode only ev/s | decode + executor ev/s |\n"
    "|---|---|---|---|---:|---:|---:|---:|",
    "replay_ab": "| date (UTC) | commit (before -> after) | machine | load avg 1/5/15 | rounds "
    "| workload | events | executor CPU ev/s before / after | decode CPU ev/s before / after "
    "| decode + executor CPU ev/s before / after (ratio) | decode + executor wall ev/s "
    "before / after |\n"
    "|---|---|---|---|---:|---|---:|---|---|---|---|",
    "restore": "| date (UTC) | commit | machine | params | records | restore s "
    "| instances/s | records/s | slowest partition s |\n"
    "|---|---|---|---|---:|---:|---:|---:|---:|",
    "restore-replica": "| date (UTC) | commit | machine | load avg (1/5/15 min) | params "
    "| records | restore s | instances/s | CPU s: replica / broker / machine "
    "| RSS MiB: restored / full cache / after 2x budget | cached | KiB per cached instance |\n"
    "|---|---|---|---|---|---:|---:|---:|---|---|---:|---:|",
    "restart": "| date (UTC) | commit | machine | static membership | params "
    "| restart-to-first-turn s (median) | max s | process up s | partitions restored s "
    "| clean-stop handover s |\n"
    "|---|---|---|---|---|---:|---:|---:|---:|---:|",
    "scale": "| date (UTC) | commit | machine | load avg | variant | partitions x replicas "
    "| params | wf/s | ratio wf/s | p50 ms | ratio p50 "
    "| CPU ms/wf (tp): processors / worker / broker / client | tx/s | records in/tx "
    "| records out/tx | ms/tx: step / produce / offsets / commit |\n"
    "|---|---|---|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|",
    "chain3-floor": "| date (UTC) | commit | machine | params | p50 ms | mean ms "
    "| client produce | fetch wake-up | turn | txn produce | txn send_offsets | txn commit "
    "| status read | txns/instance |\n"
    "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    "peers": "| date (UTC) | machine | peer / variant | wf/s | act/s | p50 ms | p99 ms "
    "| sizes |\n"
    "|---|---|---|---:|---:|---:|---:|---|",
}


def _cell(value: Any) -> str:
    return "n/a" if value is None else str(value).replace("|", "/")


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _date(result: dict[str, Any]) -> str:
    return str(result["host"]["date_utc"]).replace("T", " ").rstrip("Z")


def append_row(section: str, row: str, path: Path = PATH) -> None:
    """Insert ``row`` at the end of ``section``'s table (the section is added if missing)."""
    marker = f"<!-- rows:{section} -->"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if marker not in text:
        text = text.rstrip("\n") + f"\n\n## {section}\n\n{HEADERS[section]}\n{marker}\n"
    text = text.replace(marker, f"{row}\n{marker}", 1)
    path.write_text(text)


def _params(params: dict[str, Any], keys: tuple[str, ...]) -> str:
    return ", ".join(f"{k}={params[k]}" for k in keys if k in params)


def _cpu_cell(cpu: dict[str, float], names: tuple[str, ...]) -> str:
    return " / ".join(str(cpu.get(n, "-")) for n in names)


def _ratio(ours: float | None, theirs: float | None) -> str | None:
    if not ours or not theirs:
        return None
    return f"{ours / theirs:.2f}x"


def add_chain3(
    result: dict[str, Any], peer: dict[str, Any] | None, comparison: dict[str, Any] | None = None
) -> None:
    """``peer``: the Restate median measured in the same run, if any; ``comparison``: the
    ratios to every peer of the variant and the targets (``peers.ratios``)."""
    med = result["median"]
    cpu = med.get("cpu_ms_per_workflow_throughput", {})
    params = _params(
        result["params"], ("n_throughput", "n_latency", "repeats", "warmup", "partitions", "pin")
    )
    theirs = peer or {}
    peer_cell = (
        f"{theirs.get('workflows_per_s')}, {theirs.get('p50_ms')}" if peer is not None else None
    )
    row = _row(
        [
            _date(result),
            result["commit"],
            machine_line(result["host"]),
            result["variant"],
            params,
            med.get("workflows_per_s"),
            med.get("activities_per_s"),
            med.get("p50_ms"),
            med.get("p90_ms"),
            med.get("p99_ms"),
            med.get("max_ms"),
            _cpu_cell(cpu, ("processor", "worker", "broker", "client")),
            peer_cell,
            _ratio(med.get("workflows_per_s"), theirs.get("workflows_per_s")),
            # p50 ratio: ours / theirs, so below 1 means lower (better) latency
            _ratio(med.get("p50_ms"), theirs.get("p50_ms")),
            *_comparison_cells(comparison),
        ]
    )
    append_row("chain3", row)


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
    row = _row(
        [
            _date(result),
            result["commit"],
            machine_line(result["host"]),
            "on" if result["static"] else "off",
            _params(result["params"], ("repeats", "partitions")),
            med.get("first_turn_s"),
            med.get("max_first_turn_s"),
            med.get("up_s"),
            med.get("assigned_s"),
            med.get("handover_s"),
        ]
    )
    append_row("restart", row)


def add_fanout(result: dict[str, Any]) -> None:
    med = result["median"]
    cpu = med.get("cpu_s", {})
    row = _row(
        [
            _date(result),
            result["commit"],
            machine_line(result["host"]),
            _params(result["params"], ("n", "repeats", "partitions", "worker_concurrency")),
            med.get("wall_s"),
            med.get("activities_per_s"),
            _cpu_cell(cpu, ("processor", "worker", "broker", "client")),
        ]
    )
    append_row("fanout", row)


def add_fanout_turns(result: dict[str, Any]) -> None:
    start, end = result["start"], result["end"]
    row = _row(
        [
            _date(result),
            result["commit"],
            machine_line(result["host"]),
            _params(result["params"], ("n", "chunk", "window", "pace_ms", "partitions")),
            f"{result['open_at_start']} / {result['open_at_end']}",
            f"{start['turns']} / {end['turns']}",
            f"{start['processor_cpu_ms_per_turn']} / {end['processor_cpu_ms_per_turn']}",
            f"{result['start_over_end']}x",
            f"{start['wall_s']} / {end['wall_s']}",
            result["wall_s"],
        ]
    )
    append_row("fanout-turns", row)


def add_replay(result: dict[str, Any]) -> None:
    for workload in result["workloads"]:
        row = _row(
            [
                _date(result),
                result["commit"],
                machine_line(result["host"]),
                workload["workload"],
                workload["history_events"],
                _best(workload, "executor"),
                _best(workload, "decode"),
                _best(workload, "decode_replay"),
            ]
        )
        append_row("replay", row)


def add_replay_ab(result: dict[str, Any]) -> None:
    """Rows of ``replay_ab.py``: the same workloads before and after, from one run."""
    for w in result["workloads"]:

        def pair(measure: str, clock: str = "cpu", w: dict[str, Any] = w) -> str:
            return f"{w[f'before_{measure}_{clock}_ev_s']} / {w[f'after_{measure}_{clock}_ev_s']}"

        row = _row(
            [
                _date(result),
                f"{result['base_commit']} -> {result['commit']}",
                machine_line(result["host"]),
                " / ".join(str(x) for x in result["load_average"]),
                result["params"]["rounds"],
                w["workload"],
                w["history_events"],
                pair("executor"),
                pair("decode"),
                f"{pair('decode_replay')} ({w['decode_replay_cpu_ratio']}x)",
                pair("decode_replay", "wall"),
            ]
        )
        append_row("replay_ab", row)


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
    row = _row(
        [
            _date(result),
            result["commit"],
            machine_line(result["host"]),
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
    )
    append_row("restore-replica", row)


def add_peers(peers: list[dict[str, Any]], host: dict[str, Any]) -> None:
    for peer in peers:
        med = peer.get("median", {})
        row = _row(
            [
                str(peer.get("host", host).get("date_utc", "")).replace("T", " ").rstrip("Z"),
                machine_line(host),
                f"{peer.get('peer')} / {peer.get('variant')}",
                med.get("workflows_per_s"),
                med.get("activities_per_s"),
                med.get("p50_ms"),
                med.get("p99_ms"),
                _params(peer.get("params", {}), ("n_throughput", "n_latency", "repeats", "warmup")),
            ]
        )
        append_row("peers", row)


def add_scale(result: dict[str, Any]) -> None:
    """One row per (variant, layout); ratios are to 8 partitions x 1 replica, same run."""
    params = _params(result["params"], ("rounds", "n_throughput", "n_latency", "warmup", "pin"))
    for entry in result["rows"]:
        med = entry["median"]
        cpu = med["cpu_ms_per_workflow_throughput"]
        phases = ("step", "produce", "offsets", "commit")
        row = _row(
            [
                _date(result),
                result["commit"],
                machine_line(result["host"]),
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
        )
        append_row("scale", row)


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
    row = _row(
        [
            _date(result),
            result["commit"],
            machine_line(result["host"]),
            _params(result["params"], ("n", "repeats", "warmup", "partitions", "kafka")),
            med.get("p50_ms"),
            med.get("total_mean_ms"),
            *(segments.get(k) for k in FLOOR_SEGMENTS),
            med.get("transactions_per_instance"),
        ]
    )
    append_row("chain3-floor", row)
