"""restore_tables against a real broker: tables rebuilt from changelogs hold exactly the
committed end state (last write wins, tombstones delete, aborted records never appear),
with the offset of every changelog recorded, and a second restore continues from there.

The takeover tests cover the rule of reading to the log end offset past an open
transaction; these cover the copying itself, which the restore's hot loop does per record.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.adapters.kafka import restore as kafka_restore
from engine.adapters.kafka.config import transactional_producer_config
from engine.adapters.kafka.io import TransactionalProducer
from engine.adapters.kafka.restore import restore_tables
from engine.adapters.rocks_store import RocksPartitionStore
from engine.config.settings import load_settings
from engine.services.processor import keys
from engine.services.processor.tables import Tables

pytestmark = pytest.mark.kafka

MakeTopic = Callable[..., str]
Expected = dict[int, dict[bytes, bytes]]


@pytest.fixture
def tables(tmp_path: Path) -> Iterator[dict[int, Tables]]:
    opened = {p: Tables(p, RocksPartitionStore(tmp_path / f"p{p}")) for p in range(2)}
    yield opened
    for table in opened.values():
        table.store.close()


def _rows(table: Tables) -> dict[bytes, bytes]:
    """Every row but the restorer's own bookkeeping (the recorded offsets)."""
    return {k: v for k, v in table.store.scan(b"", b"\xff") if not k.startswith(keys.BOOKKEEPING)}


def _write(
    producer: TransactionalProducer,
    records: list[tuple[str, int, bytes, bytes | None]],
    expected: Expected,
    *,
    abort: bool = False,
) -> None:
    producer.begin()
    for topic, partition, key, value in records:
        producer.produce(topic, key, value, partition)
    if abort:
        producer.abort()
        return
    producer.commit()
    for _, partition, key, value in records:
        if value is None:
            expected[partition].pop(key, None)
        else:
            expected[partition][key] = value


def _batch(state: str, timer: str, round_: int) -> list[tuple[str, int, bytes, bytes | None]]:
    """Interleaved puts over both partitions and both changelogs, overwrites of earlier
    keys, and tombstones for some of them."""
    out: list[tuple[str, int, bytes, bytes | None]] = []
    for i in range(40):
        p = i % 2
        out.append((state, p, b"h%d" % (i % 13), b"v%d-%d" % (round_, i)))
        if i % 5 == 0:
            out.append((timer, p, b"t%d" % i, b""))
        if i % 7 == 3:
            out.append((state, p, b"h%d" % ((i + 4) % 13), None))
    return out


def test_restore_copies_the_committed_end_state_and_continues_from_its_offsets(
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tables: dict[int, Tables],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # flush to the table every few records, so staged writes cross many flushes
    monkeypatch.setattr(kafka_restore, "_APPLY_EVERY", 3)
    state, timer = make_topic(partitions=2), make_topic(partitions=2)
    settings = load_settings(bootstrap_servers=kafka_bootstrap, namespace=f"t{uuid.uuid4().hex}")
    txn_id = f"test-restore-{uuid.uuid4().hex}"
    producer = TransactionalProducer(transactional_producer_config(kafka_bootstrap, txn_id), txn_id)
    changelogs = {p: [(state, "state"), (timer, "timer")] for p in range(2)}
    expected: Expected = {0: {}, 1: {}}
    try:
        _write(producer, _batch(state, timer, 0), expected)
        _write(producer, [(state, 0, b"h1", b"aborted"), (state, 1, b"zz", b"x")], {}, abort=True)
        _write(producer, _batch(state, timer, 1), expected)
        first = restore_tables(settings, changelogs, tables)
        assert {p: _rows(t) for p, t in tables.items()} == expected
        assert first.records > 0 and not first.waits
        recorded = {p: t.recorded_offset("state") for p, t in tables.items()}
        assert all(offset is not None for offset in recorded.values())

        _write(producer, _batch(state, timer, 2), expected)
        second = restore_tables(settings, changelogs, tables)
        assert {p: _rows(t) for p, t in tables.items()} == expected
        # only the new round was read: the restore went on from the recorded offsets
        assert second.records == len(_batch(state, timer, 2))
        again = restore_tables(settings, changelogs, tables)
        assert again.records == 0
    finally:
        producer.close()
