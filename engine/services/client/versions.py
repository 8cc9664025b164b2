"""How many instances run each workflow version: what an operator checks before removing
old code (docs/how-to/change-code.md).

An instance stays on the version it started with (recorded in its ``ExecutionStarted`` and
its status), so a version can be removed once no open instance runs it - and, if the
removed code would still have to replay finished histories (``replay check``, queries of
old runs), once those no longer matter either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from engine.core.history import RuntimeStatus
from engine.core.messages import InstanceStatus
from engine.runtime.versions import version_key

__all__ = ["OPEN_STATUSES", "VersionCount", "count_versions"]

#: Statuses of instances whose code may still run (so their version must stay deployed).
OPEN_STATUSES = frozenset(
    {RuntimeStatus.PENDING, RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED, RuntimeStatus.PARKED}
)


@dataclass(frozen=True, slots=True)
class VersionCount:
    """One (workflow, version): its open instances (PENDING, RUNNING, SUSPENDED, PARKED) and the
    ended ones the status topic still knows (purged instances are gone)."""

    name: str
    version: str
    open: int
    ended: int

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "version": self.version, "open": self.open, "ended": self.ended}


def count_versions(
    statuses: Iterable[InstanceStatus], name: str | None = None
) -> list[VersionCount]:
    """Counts per (workflow name, version), sorted by name and then version order."""
    counts: dict[tuple[str, str], list[int]] = {}
    for status in statuses:
        if name is not None and status.name != name:
            continue
        slot = counts.setdefault((status.name, status.version), [0, 0])
        slot[0 if status.status in OPEN_STATUSES else 1] += 1
    ordered = sorted(counts, key=lambda key: (key[0], version_key(key[1]), key[1]))
    return [VersionCount(n, v, *counts[(n, v)]) for n, v in ordered]
