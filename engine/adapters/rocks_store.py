"""RocksDB (rocksdict) implementation of the processor's partition store.

One database per partition, so that a partition can be handed to another replica (or wiped
and restored from its changelog) without touching the others.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch


class RocksPartitionStore:
    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self.path = path
        self._db = Rdict(str(path), options)

    def get(self, key: bytes) -> bytes | None:
        value = self._db.get(key)
        return None if value is None else bytes(value)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        it.seek(start)
        while it.valid():
            key = it.key()
            if key >= end:
                break
            yield key, it.value()
            it.next()

    def write(self, changes: Mapping[bytes, bytes | None]) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in changes.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self._db.write(batch)

    def close(self) -> None:
        self._db.close()

    @staticmethod
    def destroy(path: Path) -> None:
        """Remove a partition's database (its changelog can rebuild it)."""
        shutil.rmtree(path, ignore_errors=True)
