"""The columns of every benchmark's rows in RESULTS.md and its notes pages, in table order
(kept apart from :mod:`results_md`, which writes them)."""

from __future__ import annotations

from typing import Any

#: The columns of each benchmark's rows, in table order. ``date (UTC)``/``date``,
#: ``commit``, ``machine`` and the load column are the record's own fields.
COLUMNS: dict[str, list[str]] = {
    "chain3": [
        "date (UTC)", "commit", "machine", "variant", "params", "wf/s", "act/s", "p50 ms",
        "p90 ms", "p99 ms", "max ms", "CPU ms/wf (tp): processor / worker / broker / client",
        "Restate wf/s, p50 ms", "ratio wf/s", "ratio p50",
        "ratios to the other peers (wf/s, p50)", "targets",
    ],
    "chain3-cluster": [
        "date (UTC)", "commit", "machine", "variant", "brokers", "replication factor",
        "min.insync.replicas", "params", "wf/s", "act/s", "p50 ms", "p90 ms", "p99 ms",
        "max ms", "CPU ms/wf (tp): processor / worker / brokers / client",
        "CPU ms/wf (tp) per broker", "1 broker, same run: wf/s, p50 ms, p99 ms",
        "vs 1 broker: wf/s", "vs 1 broker: p50", "vs 1 broker: p99",
    ],
    "chain3-floor": [
        "date (UTC)", "commit", "machine", "params", "p50 ms", "mean ms", "client produce",
        "fetch wake-up", "turn", "txn produce", "txn send_offsets", "txn commit",
        "status read", "txns/instance",
    ],
    "fanout": [
        "date (UTC)", "commit", "machine", "params", "wall s (median)", "activities/s",
        "CPU s: processor / worker / broker / client",
    ],
    "fanout-turns": [
        "date (UTC)", "commit", "machine", "params", "open activities: start / end",
        "turns measured: start / end", "processor CPU ms per turn: start / end",
        "start / end", "window wall s: start / end", "total wall s",
    ],
    "replay": [
        "date (UTC)", "commit", "machine", "workload", "events", "executor only ev/s",
        "decode only ev/s", "decode + executor ev/s",
    ],
    "replay_ab": [
        "date (UTC)", "commit (before -> after)", "machine", "load avg 1/5/15", "rounds",
        "workload", "events", "executor CPU ev/s before / after",
        "decode CPU ev/s before / after",
        "decode + executor CPU ev/s before / after (ratio)",
        "decode + executor wall ev/s before / after",
    ],
    "restore": [
        "date (UTC)", "commit", "machine", "params", "records", "restore s", "instances/s",
        "records/s", "slowest partition s",
    ],
    "restore-replica": [
        "date (UTC)", "commit", "machine", "load avg (1/5/15 min)", "params", "records",
        "restore s", "instances/s", "CPU s: replica / broker / machine",
        "RSS MiB: restored / full cache / after 2x budget", "cached", "KiB per cached instance",
    ],
    "metrics-overhead": [
        "date", "commit", "batch", "partitions", "metrics µs/wf", "share of 0.33 ms",
    ],
    "payload-codecs": ["date (UTC)", "commit", "machine", "rounds", "variant", "payload",
                       "wf/s", "CPU ms/wf: processor / worker", "throughput vs none"],
    "large-payloads": ["date (UTC)", "commit", "machine", "runs", "payload",
                       "round trip s (median)", "fastest / slowest s", "MB/s moved"],
    "observability-overhead": [
        "date (UTC)", "commit", "machine", "rounds", "variant", "wf/s", "processor CPU ms/wf",
        "throughput vs none", "CPU vs none",
    ],
    "idle": [
        "date (UTC)", "commit", "machine", "consumers' fetch wait", "idle s", "broker",
        "processor", "worker", "together", "client", "busy p50 ms", "wake-up ms",
        "wake-up / p50",
    ],
    "activities": [
        "date (UTC)", "commit", "machine", "variant", "act/s", "wall s", "CPU s", "transactions",
    ],
    "peers": [
        "date (UTC)", "machine", "peer / variant", "wf/s", "act/s", "p50 ms", "p99 ms", "sizes",
    ],
    "restart": [
        "date (UTC)", "commit", "machine", "static membership", "params",
        "restart-to-first-turn s (median)", "max s", "process up s", "partitions restored s",
        "clean-stop handover s",
    ],
    "failover": [
        "date (UTC)", "commit", "machine", "load avg", "case", "params", "resumed s: p50 / max",
        "other replica's longest gap s (before: load alone)",
        "changelog records the takeover restored", "takeover restore s (from its log)",
        "prefill s",
    ],
    "cluster-faults": [
        "date (UTC)", "commit", "SIGKILL the busiest leader s", "restart it s",
        "rolling restart, broker 1 / 2 / 3 s", "test wall time",
    ],
    "queries": [
        "date (UTC)", "commit", "machine", "load avg", "params",
        "start-to-outcome p50 / p99 ms", "query p50 / p99 ms", "query p50 / start p50",
    ],
    "updates": [
        "date (UTC)", "commit", "machine", "load avg", "params",
        "start-to-outcome p50 / p99 ms", "update p50 / p99 ms", "update p50 / start p50",
        "note",
    ],
    "cache-pressure": [
        "date (UTC)", "commit (before -> after)", "machine", "load avg", "params", "wf/s: "
        "before / after / fits", "after / before wf/s", "over the cache / fits wf/s", "processor "
        "CPU ms/wf: before / after / fits", "misses per lookup: before / after / fits"],
    "scale": [
        "date (UTC)", "commit", "machine", "load avg", "variant", "partitions x replicas",
        "params", "wf/s", "ratio wf/s", "p50 ms", "ratio p50",
        "CPU ms/wf (tp): processors / worker / broker / client", "tx/s", "records in/tx",
        "records out/tx", "ms/tx: step / produce / offsets / commit",
    ],
}  # fmt: skip


#: The medians a chain3 row shows, in its column order (wf/s, act/s, p50, p90, p99, max).
MEDIANS = ("workflows_per_s", "activities_per_s", "p50_ms", "p90_ms", "p99_ms", "max_ms")


def median_cells(median: dict[str, Any]) -> list[Any]:
    """A chain3 result's medians as its row's cells (single broker and cluster alike)."""
    return [median.get(key) for key in MEDIANS]
