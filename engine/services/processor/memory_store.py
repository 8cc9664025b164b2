"""The in-memory implementation of the partition store port.

It backs ``engine.testing`` and the processor's unit tests. It honours the same contract
as the RocksDB store (``tests/unit/test_store_contract.py`` runs one suite against both):
byte-ordered scans with an exclusive end, atomic batches of puts and deletes.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping

from engine.core.errors import TurnstileError


class MemoryPartitionStore:
    """One partition's tables in a dict plus a sorted key list (for ordered scans)."""

    def __init__(self) -> None:
        self._rows: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []
        self._closed = False

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: bytes) -> bytes | None:
        self._check_open()
        return self._rows.get(key)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        self._check_open()
        # lazily, like a RocksDB iterator: a reader that wants the first row (the earliest
        # timer) pays for that row, not for the whole range
        keys = self._keys
        index = bisect.bisect_left(keys, start)
        while index < len(keys) and keys[index] < end:
            key = keys[index]
            yield key, self._rows[key]
            index += 1

    def write(self, changes: Mapping[bytes, bytes | None]) -> None:
        self._check_open()
        for key, value in changes.items():
            if value is None:
                if self._rows.pop(key, None) is not None:
                    del self._keys[bisect.bisect_left(self._keys, key)]
            else:
                if key not in self._rows:
                    bisect.insort(self._keys, key)
                self._rows[key] = bytes(value)

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise TurnstileError("the partition store is closed; open a new one to read it")
