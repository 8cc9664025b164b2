"""The performance targets RESULTS.md marks met or not met, and what limits each one.

A target names the benchmark rows that measure it, how to read their measurement and the
bound it must reach; ``limits`` says in one line what holds it back while it is not met,
pointing at the notebook section whose profile shows it (``docs/explanation/performance``).
The bounds are the performance issues' targets (ratios to Restate measured in the same run).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: One recorded row: date, commit, machine, load and its ``values``.
Record = dict[str, Any]
NOTES = "../docs/explanation/performance"

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def number(cell: str | None) -> float | None:
    """The first number of a cell (``"4.44x"``, ``"5.8 %"``, ``"83010 (112022)"``)."""
    found = NUMBER.search(cell or "")
    return float(found.group()) if found else None


@dataclass(frozen=True)
class Target:
    """A performance target: which rows measure it, and how to read their measurement."""

    benchmark: str
    label: str
    target: str
    limit: float
    at_most: bool  # the measurement must stay at or under the limit (else at or above it)
    qualifies: Callable[[Record], bool]
    measure: Callable[[Record], float | None]
    shown: Callable[[Record], str]
    benchmarks: tuple[str, ...] = ()  # where to look, when not only in ``benchmark``
    limits: str = ""  # what holds it back while it is not met, with the profile's section


def variant_is(name: str) -> Callable[[Record], bool]:
    return lambda r: r["values"].get("variant") == name


def _peer_ratio(peer: str) -> Callable[[Record], float | None]:
    def measure(r: Record) -> float | None:
        found = re.search(rf"{re.escape(peer)} ([\d.]+)x", r["values"].get(_OTHERS, ""))
        return float(found.group(1)) if found else None

    return measure


def _value(column: str) -> Callable[[Record], float | None]:
    return lambda r: number(r["values"].get(column))


_OTHERS = "ratios to the other peers (wf/s, p50)"


def _chain3(variant: str, label: str, target: str, limit: float, **reading: Any) -> Target:
    measure = reading.get("measure", _value("ratio wf/s"))
    at_most = reading.get("at_most", False)
    shown: Callable[[Record], str] = reading.get(
        "shown",
        lambda r: f"{r['values']['wf/s']} wf/s, {r['values']['ratio wf/s']} Restate's",
    )
    return Target(
        "chain3",
        f"chain3 {variant}",
        target,
        limit,
        at_most,
        lambda r: variant_is(variant)(r) and measure(r) is not None,
        measure,
        shown,
        limits=reading.get("limits", ""),
    )


def _p50_vs_restate(r: Record) -> str:
    return f"p50 {r['values']['p50 ms']} ms, {r['values']['ratio p50']} Restate's"


def _vs_temporal(r: Record) -> str:
    ratio = _peer_ratio("temporal-activities")(r)
    return f"{r['values']['wf/s']} wf/s, {ratio:.2f}x Temporal `activities`"


def _replay(workload: str) -> Target:
    return Target(
        "replay",
        f"replay {workload}",
        "decode + executor >= 300,000 events/s per core",
        300_000,
        False,
        lambda r: r["values"].get("workload") == workload,
        _value("decode + executor ev/s"),
        lambda r: f"{r['values']['decode + executor ev/s']} events/s (best in brackets)",
        limits=(
            f"two interpreted loops of about equal cost, the Avro decode and the executor "
            f"([replay]({NOTES}/replay.md))"
        ),
    )


def _scale(variant: str) -> Target:
    return Target(
        "scale",
        f"scale {variant}",
        "32 partitions x 1 replica no slower than 8 x 1",
        1.0,
        False,
        lambda r: variant_is(variant)(r) and r["values"].get("partitions x replicas") == "32 x 1",
        _value("ratio wf/s"),
        lambda r: f"{r['values']['wf/s']} wf/s, {r['values']['ratio wf/s']} of 8 x 1",
        limits=(
            f"the broker: a transaction touching 4x the partitions writes 4x the markers and "
            f"record batches ([scale]({NOTES}/scale.md))"
        ),
    )


def _instances(count: int) -> Callable[[Record], bool]:
    return lambda r: f"instances={count}," in r["values"].get("params", "")


def _slowest_vs_none(r: Record) -> float | None:
    return number(r["values"].get("throughput vs none"))


def _rate_spread(r: Record) -> float | None:
    """How far the busiest or quietest 10 s of a rate-limited queue strayed from the limit."""
    shares = [float(x) for x in re.findall(r"\((\d\.\d+)\)", r["values"].get("variant", ""))]
    return max(abs(s - 1) for s in shares) if shares else None


_CPU = (
    f"two cores shared by the broker JVM and the processor's one Python thread, which holds "
    f"the GIL most of the run ([chain3]({NOTES}/chain3.md#what-limits-the-targets))"
)
_ROUND_TRIPS = (
    f"broker round trips, most of them the transaction protocol; librdkafka has no "
    f"transactions v2 (KIP-890) yet ([chain3-floor]({NOTES}/chain3-floor.md))"
)

TARGETS: tuple[Target, ...] = (
    _chain3("inline", "inline", "wf/s >= 8x Restate", 8.0, limits=_CPU),
    _chain3(
        "inline", "inline", "p50 <= 0.8x Restate", 0.8,
        measure=_value("ratio p50"), at_most=True, shown=_p50_vs_restate,
        limits=f"one transaction per instance: {_ROUND_TRIPS}",
    ),
    _chain3(
        "activities", "activities", "wf/s >= 3x Restate", 3.0,
        limits=f"four turns per workflow on the processor; {_CPU}",
    ),
    _chain3(
        "activities", "activities", "wf/s >= 30x Temporal `activities`", 30.0,
        measure=_peer_ratio("temporal-activities"), shown=_vs_temporal,
    ),
    _chain3(
        "activities", "activities", "p50 <= 2x Restate", 2.0,
        measure=_value("ratio p50"), at_most=True, shown=_p50_vs_restate,
        limits=f"four transactions and three worker hops in sequence: {_ROUND_TRIPS}",
    ),
    _chain3(
        "activities", "activities", "p99 <= 100 ms", 100.0,
        measure=_value("p99 ms"), at_most=True,
        shown=lambda r: f"p99 {r['values']['p99 ms']} ms",
        limits=f"the broker's tail on busy shared cores ([chain3]({NOTES}/chain3.md))",
    ),
    _replay("chain_1000"),
    _replay("fan_out_1000"),
    Target(
        "restore", "restore 100,000 instances", "within 10 s", 10.0, True,
        _instances(100_000), _value("restore s"),
        lambda r: f"{r['values']['restore s']} s",
        benchmarks=("restore", "restore-replica"),
    ),
    Target(
        "restore-replica", "restore 1,000,000 instances", "within 20 s of the replica's CPU",
        20.0, True, _instances(1_000_000), _value("CPU s: replica / broker / machine"),
        lambda r: (
            f"{number(r['values']['CPU s: replica / broker / machine'])} replica CPU-s "
            f"({r['values']['restore s']} s wall, load {r['load']})"
        ),
    ),
    Target(
        "idle", "idle engine", "broker + processor + worker <= 2 % of a core", 2.0, True,
        lambda r: True, _value("together"),
        lambda r: (
            f"{r['values']['together']} (broker {r['values']['broker']}, processor "
            f"{r['values']['processor']}, worker {r['values']['worker']})"
        ),
        limits=(
            f"the broker: its own floor (1.6-1.9 % bare) plus answering the engine's fetches "
            f"and heartbeats ([idle]({NOTES}/idle.md))"
        ),
    ),
    Target(
        "idle", "idle wake-up", "first workflow after silence <= 1.5x busy p50", 1.5, True,
        lambda r: True, _value("wake-up / p50"),
        lambda r: (
            f"{r['values']['wake-up ms']} ms against {r['values']['busy p50 ms']} ms: "
            f"{r['values']['wake-up / p50']}x"
        ),
        limits=f"one sample per silence, within single workflows' spread ([idle]({NOTES}/idle.md))",
    ),
    Target(
        "queries", "query round trip", "query p50 <= 2x start-to-outcome p50", 2.0, True,
        lambda r: True, _value("query p50 / start p50"),
        lambda r: (
            f"{r['values']['query p50 / p99 ms']} ms against "
            f"{r['values']['start-to-outcome p50 / p99 ms']} ms (p50 / p99): "
            f"{r['values']['query p50 / start p50']}x"
        ),
    ),
    Target(
        "updates", "update round trip", "update p50 <= 2x start-to-outcome p50 (one turn more)",
        2.0, True, lambda r: True, _value("update p50 / start p50"),
        lambda r: (
            f"{r['values']['update p50 / p99 ms']} ms against "
            f"{r['values']['start-to-outcome p50 / p99 ms']} ms (p50 / p99): "
            f"{r['values']['update p50 / start p50']}x"
        ),
    ),
    _scale("inline"),
    _scale("activities"),
    Target(
        "cache-pressure", "2x the cache in flight", "wf/s >= 0.9x of when they fit", 0.9, False,
        lambda r: True, _value("over the cache / fits wf/s"),
        lambda r: r["values"]["over the cache / fits wf/s"] + "x of the wf/s when they fit"),
    Target(
        "metrics-overhead", "metrics", "<= 5 % of the processor's CPU per workflow", 5.0, True,
        lambda r: "%" in r["values"].get("share of 0.33 ms", ""), _value("share of 0.33 ms"),
        lambda r: f"{r['values']['share of 0.33 ms']} (batch of {r['values']['batch']})",
    ),
    Target(
        "observability-overhead", "traces, every run recorded",
        "throughput >= 0.95x without", 0.95, False,
        lambda r: r["values"].get("variant") == "metrics + tracing", _slowest_vs_none,
        lambda r: f"{r['values']['throughput vs none']}x, CPU {r['values']['CPU vs none']}x",
    ),
    Target(
        "observability-overhead", "traces, 10 % sampled", "throughput >= 0.95x without",
        0.95, False,
        lambda r: r["values"].get("variant") == "metrics + tracing, 10 % sampled",
        _slowest_vs_none,
        lambda r: f"{r['values']['throughput vs none']}x, CPU {r['values']['CPU vs none']}x",
    ),
    Target("payload-codecs", "zstd + aes-gcm, 10 KB", "throughput >= 0.90x without", 0.90,
           False, variant_is("zstd, aes-gcm"), _slowest_vs_none,
           lambda r: f"{r['values']['wf/s']} wf/s, {r['values']['throughput vs none']}x"),
    Target(
        "activities", "task queue rate limit", "every 10 s within 10 % of the limit", 0.10,
        True, lambda r: _rate_spread(r) is not None, _rate_spread,
        lambda r: f"at most {_rate_spread(r):.1%} off",
        limits=f"measured on a saturated machine ([activities]({NOTES}/activities.md))",
    ),
)  # fmt: skip
