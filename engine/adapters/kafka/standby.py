"""Warm standbys: keep local copies of partitions this replica does not own, so that taking
one over replays only the last few changelog records instead of the whole table.

With ``standby_replicas = N`` a replica tails the state and timer changelogs of the
partitions it would be given if N or fewer of its live peers died
(:func:`engine.services.processor.standby.standby_partitions` predicts librdkafka's range
assignor from the peers the liveness records show) into the same RocksDB database the
processor opens when the partition is assigned (``{state_dir}/{namespace}/{replica_id}/pN``),
recording the changelog offsets it reached in the same rows a restore does. A takeover's
restore then starts from those offsets (``kafka.restore``: it reads from the offset each
table recorded), so it reads only what the standby had not applied yet - and, as always, to
the committed end, so a lagging or wrong copy costs time, never correctness.

A standby copy is exactly what a restore would build from the same records: the same
read_committed reader, the same rows written with the same offsets, in changelog order. It
never writes to Kafka and never joins a group: its consumer uses ``assign()`` with explicit
offsets and commits nothing (its ``group.id`` is the restore's, which needs no ACL of its own).

Handing a partition between the standby and the processor: a RocksDB database has one
writer, so the processor *claims* a partition (:meth:`Standbys.claim`) before it opens it,
which closes the copy at once, and gives it back (:meth:`Standbys.unclaim`) after it closed
its own store on a revocation; the copy is then kept warm from where the processor left it,
if this replica still stands by for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from engine.adapters.kafka.config import consumer_config
from engine.adapters.kafka.io import log_end_offsets
from engine.adapters.rocks_store import RocksPartitionStore
from engine.config.settings import Settings
from engine.config.topics import TopicNames
from engine.services.processor.standby import standby_partitions
from engine.services.processor.tables import STATE_CHANGELOG, TIMER_CHANGELOG, Tables

__all__ = ["Standbys"]

log = logging.getLogger("engine.processor")

#: How often the partitions to stand by for are worked out again from the live peers.
CHOOSE_EVERY_S = 1.0
#: Records one consume() call may return, and how long it waits for the first.
_CONSUME_MAX = 10_000
_POLL_S = 0.2


@dataclass
class _Copy:
    """One partition's warm copy: its tables and, per changelog topic, the next offset."""

    partition: int
    tables: Tables
    names: dict[str, str]
    next: dict[str, int] = field(default_factory=dict)
    #: The end each changelog had when the copy was opened: the lag until a fetch tells more.
    ends: dict[str, int] = field(default_factory=dict)
    #: Reached the committed end once since it was opened (logged once).
    caught_up: bool = False


class Standbys:
    """This replica's warm copies, kept up to date on a thread of their own."""

    def __init__(
        self,
        settings: Settings,
        topics: TopicNames,
        peers: Callable[[], Iterable[str]],
        path_of: Callable[[int], Path],
    ) -> None:
        """``peers``: the live peers' replica ids (their ``group.instance.id``);
        ``path_of``: the folder of a partition's database, the processor's own."""
        self.settings = settings
        self._changelogs = {
            topics.state_changelog: STATE_CHANGELOG,
            topics.timer_changelog: TIMER_CHANGELOG,
        }
        self._peers = peers
        self._path_of = path_of
        self._lock = threading.Lock()
        self._copies: dict[int, _Copy] = {}
        #: Partitions the processor owns or is taking: never opened here meanwhile.
        self._claimed: set[int] = set()
        #: Changelog records applied to copies since the start (a metric).
        self.applied = 0
        #: Records each copy is behind its changelogs' committed end (a metric).
        self.lag: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="standbys", daemon=True)

    # --- the processor's side ---------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        with self._lock:
            for copy in self._copies.values():
                copy.tables.store.close()
            self._copies.clear()
            self.lag = {}

    def claim(self, partitions: Iterable[int]) -> None:
        """The processor takes ``partitions``: close their copies now (their databases are
        then the processor's to open, already up to date)."""
        with self._lock:
            self._claimed.update(partitions)
            self._drop(partitions)

    def unclaim(self, partitions: Iterable[int]) -> None:
        """The processor closed ``partitions``' stores: they may be stood by for again."""
        with self._lock:
            self._claimed.difference_update(partitions)

    def _drop(self, partitions: Iterable[int]) -> None:
        """Close the copies of ``partitions`` (the lock held)."""
        for p in partitions:
            copy = self._copies.pop(p, None)
            if copy is not None:
                copy.tables.store.close()
                self.lag.pop(p, None)

    # --- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        config = consumer_config(
            self.settings.bootstrap_servers,
            f"{self.settings.namespace}.restore",
            client_id=f"{self.settings.namespace}.standby.{self.settings.replica_id}",
            **self.settings.extra_kafka,
        )
        self._config = config
        consumer = Consumer(config)
        chosen_at = 0.0
        try:
            while not self._stop.is_set():
                try:
                    if time.monotonic() - chosen_at >= CHOOSE_EVERY_S:
                        chosen_at = time.monotonic()
                        self._choose(consumer)
                    messages = consumer.consume(_CONSUME_MAX, _POLL_S)
                except Exception as exc:  # a copy only lags; a takeover's restore completes it
                    log.warning("standbys: %s (tried again in a second)", exc)
                    self._stop.wait(1.0)
                    continue
                self._apply(messages)
                self._note_lag(consumer)
        except Exception:  # the thread must not die silently: takeovers then restore in full
            log.exception("standbys stopped; takeovers restore from the changelogs in full")
        finally:
            consumer.close()

    def _choose(self, consumer: Consumer) -> None:
        """Open copies of the partitions to stand by for now, close the others."""
        me = self.settings.replica_id
        wanted = standby_partitions(
            me, self._peers(), self.settings.partitions, self.settings.standby_replicas
        )
        with self._lock:
            wanted -= self._claimed
            self._drop([p for p in self._copies if p not in wanted])
            added = sorted(wanted - set(self._copies))
        gone = [tp for tp in consumer.assignment() if tp.partition not in self._copies]
        if gone:
            consumer.incremental_unassign(gone)
        if added:
            self._open(consumer, added)

    def _open(self, consumer: Consumer, partitions: list[int]) -> None:
        wanted = [TopicPartition(t, p) for p in partitions for t in self._changelogs]
        bounds = log_end_offsets(self._config, wanted)
        opened: dict[int, _Copy] = {}
        with self._lock:
            try:
                for p in partitions:
                    if p not in self._claimed:  # else the processor took it meanwhile
                        opened[p] = self._open_copy(p, bounds)
            except BaseException:
                for copy in opened.values():
                    copy.tables.store.close()
                raise
            self._copies.update(opened)
        assign = [
            TopicPartition(t, p, copy.next[t] if copy.next[t] else OFFSET_BEGINNING)
            for p, copy in opened.items()
            for t in self._changelogs
        ]
        if not assign:
            return
        try:
            consumer.incremental_assign(assign)
        except BaseException:  # not read, so not kept: the next choice opens them again
            with self._lock:
                self._drop(opened)
            raise
        log.info("standing by for partitions %s", sorted(opened))

    def _open_copy(self, p: int, bounds: dict[tuple[str, int], tuple[int, int]]) -> _Copy:
        """Open partition ``p``'s database and say where each changelog resumes. A copy older
        than what a changelog retains is dropped and rebuilt from the start (the restore
        would refuse it)."""
        path = self._path_of(p)
        copy = _Copy(p, Tables(p, RocksPartitionStore(path)), dict(self._changelogs))
        for topic, name in self._changelogs.items():
            low, end = bounds[(topic, p)]
            recorded = copy.tables.recorded_offset(name)
            if recorded is not None and recorded + 1 < low:
                log.warning(
                    "standby copy of partition %d is older than %s keeps: rebuilt", p, topic
                )
                copy.tables.store.close()
                RocksPartitionStore.destroy(path)
                return self._open_copy(p, {k: (0, v[1]) for k, v in bounds.items()})
            copy.next[topic] = 0 if recorded is None else recorded + 1
            copy.ends[topic] = end
        return copy

    def _apply(self, messages: list[Message]) -> None:
        """Write the records into their copies, one WriteBatch per copy and changelog, with
        the offset reached (what a restore writes for the same records)."""
        staged: dict[tuple[int, str], dict[bytes, bytes | None]] = {}
        last: dict[tuple[int, str], int] = {}
        with self._lock:
            for message in messages:
                if message.error() is not None:
                    continue
                topic, p, offset = message.topic() or "", message.partition(), message.offset()
                copy = self._copies.get(p or 0)
                if copy is None or offset is None or offset < copy.next.get(topic, 0):
                    continue  # closed or reopened since it was fetched: read again from there
                key = (copy.partition, topic)
                staged.setdefault(key, {})[message.key() or b""] = message.value()
                last[key] = offset
                self.applied += 1
            for (p, topic), changes in staged.items():
                copy = self._copies[p]
                copy.tables.apply(changes, {copy.names[topic]: last[(p, topic)]})
                copy.next[topic] = last[(p, topic)] + 1

    def _note_lag(self, consumer: Consumer) -> None:
        """Offsets each copy is behind: the committed end (the high mark a read_committed
        reader's last fetch brought: the last stable offset) minus the consumer's position
        (past transaction markers it skipped) or the next offset to apply, whichever is
        further. No broker round trip: both are what the last fetch left."""
        assigned = consumer.assignment()
        positions = (
            {(tp.topic, tp.partition): tp.offset for tp in consumer.position(assigned) if assigned}
            if assigned
            else {}
        )
        with self._lock:
            lag = {}
            for p, copy in self._copies.items():
                behind = 0
                for topic in self._changelogs:
                    _low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, p), cached=True
                    )
                    end = high if high >= 0 else copy.ends[topic]
                    at = max(copy.next[topic], positions.get((topic, p), -1))
                    behind += max(end - at, 0)
                lag[p] = behind
                if not behind and not copy.caught_up:
                    copy.caught_up = True
                    log.info("standby copy of partition %d caught up", p)
            self.lag = lag
