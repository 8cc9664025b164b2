"""Restore partitions' tables from their changelogs, to the committed end and never short of it.

The rule (ARCHITECTURE.md, "Restore to the committed end"): a partition counts as restored
only when every record committed to its changelogs has been read. A read_committed consumer
stops at the *last stable offset* (LSO): the first offset of a transaction that is still open.
Records that other producers committed after that open transaction sit beyond the LSO and are
invisible until the transaction ends. That happens at every ordinary crash: the dead replica's
last transaction stays open until the broker aborts it (``transaction.timeout.ms``), and
meanwhile a second replica may own the partition, commit turns and lose it again. Restoring
"to partition EOF" would then stop at the LSO and build stale tables on which the next turn
forks the history.

So the restorer reads the *log end offset* (what a read_uncommitted reader sees, open
transactions included) when it starts, and reads each changelog partition with
read_committed until its position reaches that end. While the LSO lags behind, the partition
waits, with a log line and a counter saying which changelog partition waits on what; the
wait ends when the open transaction commits or aborts - at the latest after the broker's
transaction timeout. Kafka Streams follows the same rule: its changelog reader restores to
the end offset fetched with read_uncommitted semantics and keeps the task in RESTORING until
the consumer's position reaches it.

All changelog partitions of one assignment are restored by one consumer at once, so waits on
several open transactions overlap instead of adding up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from engine.adapters.kafka.config import consumer_config
from engine.adapters.kafka.io import log_end_offsets
from engine.config.settings import Settings
from engine.config.topics import TopicNames
from engine.core.errors import TurnstileError
from engine.services.processor.partition import PartitionProcessor
from engine.services.processor.tables import STATE_CHANGELOG, TIMER_CHANGELOG

__all__ = [
    "RestoreInterrupted",
    "RestoreReport",
    "RestoreTable",
    "restore_partitions",
    "restore_tables",
]

log = logging.getLogger("engine.processor")

#: Staged records per changelog partition before they go to its table in one batch: every
#: changelog partition of an assignment stages at once, so this bounds the restore's memory.
_APPLY_EVERY = 10_000
#: Records one consume() call may return: large, so the per-call cost is spread thin.
_CONSUME_MAX = 10_000
_POLL_S = 0.05
_WAIT_LOG_EVERY_S = 5.0


class RestoreTable(Protocol):
    """What the restorer needs of a partition's tables."""

    def recorded_offset(self, name: str) -> int | None: ...

    def apply(self, changes: dict[bytes, bytes | None], offsets: dict[str, int]) -> None: ...


class RestoreInterrupted(TurnstileError):
    """The replica was asked to stop while a partition was still being restored."""


@dataclass
class RestoreReport:
    """What a restore did: records applied, seconds spent, and the longest wait for an open
    transaction (waits of several changelog partitions overlap, so the longest is what the
    restore lost to them)."""

    records: int = 0
    seconds: float = 0.0
    waited_s: float = 0.0
    waits: list[str] = field(default_factory=list)


@dataclass
class _Changelog:
    """One changelog partition being restored into one table."""

    topic: str
    partition: int
    name: str
    table: RestoreTable
    start: int
    end: int
    pending: dict[bytes, bytes | None] = field(default_factory=dict)
    last: int = -1
    records: int = 0
    waiting_since: float | None = None
    last_wait_log: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.topic}[{self.partition}]"


def restore_tables(
    settings: Settings,
    changelogs: Mapping[int, Sequence[tuple[str, str]]],
    tables: Mapping[int, RestoreTable],
    *,
    stop: threading.Event | None = None,
) -> RestoreReport:
    """Bring ``tables[p]`` up to the committed end of each changelog ``changelogs[p]`` names
    (``(topic, table name)`` pairs), reading from the offset each table recorded.

    Returns when every changelog partition was read to the log end offset seen at the start;
    raises :class:`RestoreInterrupted` when ``stop`` is set first (the partitions must then not
    be processed) and :class:`TurnstileError` when local state is older than the changelog keeps.
    """
    started = time.monotonic()
    report = RestoreReport()
    work = _plan(settings, changelogs, tables)
    if work:
        config = consumer_config(
            settings.bootstrap_servers, f"{settings.namespace}.restore", **settings.extra_kafka
        )
        config.update({"enable.partition.eof": True, "fetch.wait.max.ms": 10})
        consumer = Consumer(config)
        try:
            consumer.assign([TopicPartition(c.topic, c.partition, c.start) for c in work])
            _read_to_end(consumer, {(c.topic, c.partition): c for c in work}, report, stop)
        finally:
            consumer.close()
    report.records = sum(c.records for c in work)
    report.seconds = time.monotonic() - started
    return report


def _plan(
    settings: Settings,
    changelogs: Mapping[int, Sequence[tuple[str, str]]],
    tables: Mapping[int, RestoreTable],
) -> list[_Changelog]:
    """The changelog partitions that hold records the tables have not seen yet."""
    wanted = [(topic, p, name) for p, pairs in sorted(changelogs.items()) for topic, name in pairs]
    config = consumer_config(
        settings.bootstrap_servers, f"{settings.namespace}.restore", **settings.extra_kafka
    )
    bounds = log_end_offsets(config, [TopicPartition(t, p) for t, p, _ in wanted])
    work = []
    for topic, p, name in wanted:
        table = tables[p]
        low, end = bounds[(topic, p)]
        recorded = table.recorded_offset(name)
        if recorded is not None and recorded + 1 < low:
            raise TurnstileError(
                f"local state of partition {p} is older than the changelog {topic} retains; "
                f"delete {settings.state_dir} for this replica and restart"
            )
        first = 0 if recorded is None else recorded + 1
        if end > first:
            start = OFFSET_BEGINNING if recorded is None else first
            work.append(_Changelog(topic, p, name, table, start, end))
    return work


def _read_to_end(
    consumer: Consumer,
    work: dict[tuple[str, int], _Changelog],
    report: RestoreReport,
    stop: threading.Event | None,
) -> None:
    """Consume until every changelog partition's position reached its end offset."""
    open_ = dict(work)
    last_progress = time.monotonic()
    while open_:
        if stop is not None and stop.is_set():
            raise RestoreInterrupted(
                f"stopped while restoring {', '.join(sorted(c.label for c in open_.values()))}"
            )
        _take_all(consumer.consume(_CONSUME_MAX, _POLL_S), open_, report)
        now = time.monotonic()
        for changelog in open_.values():
            _note_wait(changelog, now)
        if now - last_progress >= _WAIT_LOG_EVERY_S:
            last_progress = now
            for changelog in open_.values():
                if changelog.waiting_since is None and changelog.records:
                    log.info("restoring %s: %d records so far", changelog.label, changelog.records)
    for changelog in work.values():
        _flush(changelog)


def _take_all(
    messages: list[Message], open_: dict[tuple[str, int], _Changelog], report: RestoreReport
) -> None:
    """Stage one consumed batch in the tables' pending writes.

    This loop runs once per changelog record (a restore reads millions), so it does as
    little as it can per record: the value is kept as the bytes it arrived as (a restore
    copies rows, it never decodes them), and since a fetch returns runs of records of one
    changelog partition, the partition is looked up once per run rather than per record.
    """
    current: _Changelog | None = None
    pending: dict[bytes, bytes | None] = {}
    for message in messages:
        if message.error() is not None:
            current = None
            _take_event(message, open_, report)
            continue
        partition = message.partition()
        topic = message.topic()
        if current is None or partition != current.partition or topic != current.topic:
            current = open_.get((topic or "", partition or 0))
            if current is None:
                continue
            pending = current.pending
        pending[message.key() or b""] = message.value()
        current.last = message.offset() or 0
        current.records += 1
        if len(pending) >= _APPLY_EVERY:
            _flush(current)
            pending = current.pending


def _take_event(
    message: Message, open_: dict[tuple[str, int], _Changelog], report: RestoreReport
) -> None:
    """A consumer event: the end of a changelog partition (or an error to raise)."""
    key = (message.topic() or "", message.partition() or 0)
    changelog = open_.get(key)
    if changelog is None:
        return
    error = message.error()
    assert error is not None
    if error.code() != KafkaError._PARTITION_EOF:
        raise TurnstileError(f"restoring {changelog.label}: {error}")
    reached = message.offset() or 0
    if reached >= changelog.end:
        _finish_wait(changelog, report)
        _flush(changelog)
        del open_[key]
    elif changelog.waiting_since is None:
        # The last stable offset stops short of the end: a transaction is still open there.
        changelog.waiting_since = time.monotonic()
        changelog.last_wait_log = changelog.waiting_since
        what = (
            f"{changelog.label} waits for an open transaction: committed records are read up "
            f"to offset {reached} (the last stable offset), the log ends at {changelog.end}; "
            f"the partition is not processed until the transaction commits or aborts"
        )
        report.waits.append(what)
        log.warning("restoring %s", what)


def _note_wait(changelog: _Changelog, now: float) -> None:
    if changelog.waiting_since is None or now - changelog.last_wait_log < _WAIT_LOG_EVERY_S:
        return
    changelog.last_wait_log = now
    log.warning(
        "restoring %s: still waiting for an open transaction after %.0fs (log end %d); it "
        "ends at the latest when the broker's transaction timeout aborts it",
        changelog.label,
        now - changelog.waiting_since,
        changelog.end,
    )


def _finish_wait(changelog: _Changelog, report: RestoreReport) -> None:
    if changelog.waiting_since is None:
        return
    waited = time.monotonic() - changelog.waiting_since
    report.waited_s = max(report.waited_s, waited)
    log.info("restoring %s: the open transaction ended after %.1fs", changelog.label, waited)
    changelog.waiting_since = None


def _flush(changelog: _Changelog) -> None:
    if changelog.pending:
        changelog.table.apply(changelog.pending, {changelog.name: changelog.last})
        changelog.pending = {}


def restore_partitions(
    settings: Settings,
    topics: TopicNames,
    partitions: Mapping[int, PartitionProcessor],
    stop: threading.Event | None = None,
) -> RestoreReport:
    """Bring the partitions' tables up to the committed end of their two changelogs."""
    changelogs = [
        (topics.state_changelog, STATE_CHANGELOG),
        (topics.timer_changelog, TIMER_CHANGELOG),
    ]
    return restore_tables(
        settings,
        {p: changelogs for p in partitions},
        {p: pp.tables for p, pp in partitions.items()},
        stop=stop,
    )
