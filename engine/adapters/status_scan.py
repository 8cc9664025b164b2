"""A list of instances with bounded memory: the status topic, folded on disk, then paged.

The status topic is compacted, but compaction runs late: until it does, an instance may have
many records on it, and only the last one counts (a later status, or a tombstone after a
purge). Picking a page needs each instance's latest record, so the records are first
folded into a temporary RocksDB (key: instance id, value: the raw record; a tombstone
deletes), written in batches of at most ``batch`` records; then every row is decoded and
offered to a :class:`PageCollector`, which holds one page. What stays in memory is one
write batch, RocksDB's write buffer and the page; what it costs is a read of the whole
topic and a temporary copy of it on disk per list.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch

from engine.adapters.kafka.history import ProgressCallback, ReadEnd, TopicReader
from engine.codec import decode_message
from engine.config.settings import Settings
from engine.config.topics import topic_names
from engine.core.errors import CodecError
from engine.core.messages import InstanceStatus
from engine.services.client.listing import InstancePage, PageCollector

__all__ = ["StatusFold", "fold_status_topic", "list_page_from_topic"]

log = logging.getLogger(__name__)

#: Records folded in memory before they are written to the RocksDB in one batch.
FOLD_BATCH = 1000


class StatusFold:
    """The latest record per instance of a status topic, in a RocksDB that is removed on
    close. ``held_peak`` is the most records it ever held in memory before writing them."""

    def __init__(self, path: Path, *, batch: int = FOLD_BATCH) -> None:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self.path = path
        self.batch = batch
        self._db = Rdict(str(path), options)
        self._pending: dict[bytes, bytes | None] = {}
        self.held_peak = 0
        self.records = 0
        self.skipped = 0

    @classmethod
    def temporary(cls, *, batch: int = FOLD_BATCH) -> StatusFold:
        return cls(Path(tempfile.mkdtemp(prefix="turnstile-list-")), batch=batch)

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """Fold one record in (a record without a key is no instance's, and skipped)."""
        self.records += 1
        if key is None:
            self.skipped += 1
            return
        self._pending[key] = value
        self.held_peak = max(self.held_peak, len(self._pending))
        if len(self._pending) >= self.batch:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        batch = WriteBatch(raw_mode=True)
        for key, value in self._pending.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self._db.write(batch)
        self._pending.clear()

    def statuses(self) -> Iterator[InstanceStatus]:
        """Every instance's latest status, in key order (undecodable rows are skipped)."""
        self.flush()
        it = self._db.iter()
        it.seek_to_first()
        while it.valid():
            status = self._decoded(bytes(it.value()))
            if status is not None:
                yield status
            it.next()

    def _decoded(self, value: bytes) -> InstanceStatus | None:
        try:
            message = decode_message(value)
        except CodecError as exc:
            self.skipped += 1
            log.warning("skipping an undecodable status record: %s", exc)
            return None
        if not isinstance(message, InstanceStatus):
            self.skipped += 1
            return None
        return message

    def close(self) -> None:
        self._db.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> StatusFold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def list_page_from_topic(
    settings: Settings,
    collector: PageCollector,
    *,
    on_progress: ProgressCallback | None = None,
    fold: StatusFold | None = None,
) -> InstancePage[InstanceStatus]:
    """Read the namespace's status topic to its last stable offset (what was committed when
    the list started: an open transaction is not waited for, like the client's status
    view), fold it on disk, and collect a page.

    ``fold``: one the caller made and closes (to see what it held); by default a temporary
    one, removed before this returns."""
    with contextlib.ExitStack() as stack:
        if fold is None:
            fold = stack.enter_context(StatusFold.temporary())
        fold_status_topic(settings, fold, on_progress=on_progress)
        collector.add_all(fold.statuses())
    return collector.page()


def fold_status_topic(
    settings: Settings, fold: StatusFold, *, on_progress: ProgressCallback | None = None
) -> None:
    """Read the namespace's status topic to its end into ``fold``; ``fold.statuses()``
    then gives every instance's latest status in instance-id order (the key order), which
    is the order a bulk job handles them in. Like ``list`` it reads to the last stable offset,
    so a busy partition never holds it up."""
    with TopicReader(settings, end=ReadEnd.LAST_STABLE) as reader:
        for record in reader.read(topic_names(settings.namespace).status, on_progress=on_progress):
            fold.apply(record.key, record.value)
