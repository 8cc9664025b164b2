"""Read a processor replica's RocksDB tables from disk, without disturbing the replica.

``audit state`` prefers the state-changelog topic (the same rows, and it works while the
replica runs: a running replica holds its database's lock). Reading the files is for a
replica that is stopped, or to check that a replica's local copy matches its changelog.
Databases are opened read-only, which takes no lock and writes nothing.

Layout: ``{state_dir}/{namespace}/{replica_id}/p{partition}``, one database per partition.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

from engine.core.errors import ConfigurationError
from engine.services.processor import keys

__all__ = ["read_state_rows", "replica_partitions"]


def replica_partitions(state_dir: str | Path, namespace: str, replica_id: str) -> dict[int, Path]:
    """The partition databases a replica has on disk: partition -> folder."""
    root = Path(state_dir) / namespace / replica_id
    if not root.is_dir():
        raise ConfigurationError(
            f"no state of replica {replica_id!r} in namespace {namespace!r} under {state_dir} "
            f"(expected {root}); check --state-dir, --replica-id and --namespace"
        )
    found = {}
    for path in root.iterdir():
        if path.is_dir() and path.name.startswith("p") and path.name[1:].isdigit():
            found[int(path.name[1:])] = path
    return dict(sorted(found.items()))


def read_state_rows(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """Every instance row and history row of one partition database, in key order."""
    options = Options(raw_mode=True)
    db = Rdict(str(path), options, access_type=AccessType.read_only())
    try:
        for prefix in (keys.HISTORY, keys.META):
            it = db.iter()
            it.seek(prefix)
            while it.valid():
                key = bytes(it.key())
                if not key.startswith(prefix):
                    break
                yield key, bytes(it.value())
                it.next()
    finally:
        db.close()
