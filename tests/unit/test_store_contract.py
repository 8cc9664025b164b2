"""One contract for the partition store port, run against both implementations: the
RocksDB store the processor uses in production and the in-memory one behind
engine.testing. A behaviour the processor relies on belongs here, so both keep it."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.adapters.rocks_store import MEMTABLE_BYTES, RocksPartitionStore
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.ports import PartitionStore

Factory = Callable[[Path], PartitionStore]

STORES: dict[str, Factory] = {
    "memory": lambda path: MemoryPartitionStore(),
    "rocksdb": lambda path: RocksPartitionStore(path),
}


@pytest.fixture(params=sorted(STORES))
def make_store(request: pytest.FixtureRequest) -> Iterator[Factory]:
    yield STORES[request.param]


@pytest.fixture
def store(make_store: Factory, tmp_path: Path) -> Iterator[PartitionStore]:
    opened = make_store(tmp_path / "db")
    yield opened
    opened.close()


def test_a_missing_key_reads_as_none(store: PartitionStore) -> None:
    assert store.get(b"nothing") is None


def test_a_batch_puts_and_deletes(store: PartitionStore) -> None:
    store.write({b"a": b"1", b"b": b"2"})
    store.write({b"a": None, b"c": b"3"})
    assert (store.get(b"a"), store.get(b"b"), store.get(b"c")) == (None, b"2", b"3")


def test_deleting_a_missing_key_is_no_error(store: PartitionStore) -> None:
    store.write({b"never": None})
    assert store.get(b"never") is None


def test_an_empty_value_is_a_value_not_a_delete(store: PartitionStore) -> None:
    store.write({b"t": b""})
    assert store.get(b"t") == b""
    assert list(store.scan(b"t", b"u")) == [(b"t", b"")]


def test_scan_is_in_byte_order_with_an_exclusive_end(store: PartitionStore) -> None:
    store.write({k: k for k in (b"m\x00b", b"m\x00a", b"m", b"m\xff", b"n", b"l")})
    assert [k for k, _ in store.scan(b"m", b"n")] == [b"m", b"m\x00a", b"m\x00b", b"m\xff"]
    assert list(store.scan(b"x", b"z")) == []


def test_binary_keys_and_values_round_trip(store: PartitionStore) -> None:
    key, value = bytes(range(256)), bytes(reversed(range(256)))
    store.write({key: value})
    assert store.get(key) == value


def test_rocksdb_rows_survive_a_reopen(tmp_path: Path) -> None:
    first = RocksPartitionStore(tmp_path / "db")
    first.write({b"k": b"v"})
    first.close()
    again = RocksPartitionStore(tmp_path / "db")
    assert again.get(b"k") == b"v"
    again.close()


keys_st = st.binary(min_size=0, max_size=4)
ops_st = st.lists(
    st.dictionaries(keys_st, st.one_of(st.none(), st.binary(max_size=3)), max_size=6),
    max_size=8,
)


@pytest.mark.parametrize("name", sorted(STORES))
@settings(max_examples=40, deadline=None)
@given(batches=ops_st, bounds=st.tuples(keys_st, keys_st))
def test_the_store_behaves_like_a_sorted_dict(
    name: str, batches: list[dict[bytes, bytes | None]], bounds: tuple[bytes, bytes]
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = STORES[name](Path(folder) / "db")
        model: dict[bytes, bytes] = {}
        try:
            for batch in batches:
                store.write(batch)
                for key, value in batch.items():
                    if value is None:
                        model.pop(key, None)
                    else:
                        model[key] = value
            start, end = min(bounds), max(bounds)
            expected = sorted((k, v) for k, v in model.items() if start <= k < end)
            assert list(store.scan(start, end)) == expected
            assert all(store.get(k) == v for k, v in model.items())
        finally:
            store.close()


def test_rocksdb_rows_written_past_its_memtables_survive_a_reopen(tmp_path: Path) -> None:
    first = RocksPartitionStore(tmp_path / "db")
    value = bytes(4096)
    rows = (MEMTABLE_BYTES * 3 // 2) // len(value)  # more than a memtable holds: a flush
    for start in range(0, rows, 1000):
        first.write({b"k%08d" % i: value for i in range(start, min(start + 1000, rows))})
    first.close()
    again = RocksPartitionStore(tmp_path / "db")
    assert [k for k, _ in again.scan(b"k", b"l")] == [b"k%08d" % i for i in range(rows)]
    again.close()
