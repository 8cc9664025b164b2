"""Which task offsets the activity worker may commit: commit after delivery, per partition.

Tasks run concurrently and finish out of order, and each may produce records (a result, a
dead letter, a note, a requeued task) that the broker acknowledges later still. A
partition's offset may only move up to its lowest task that is not *settled* - finished,
with every record of it delivered - or a crash after the commit would lose what was not
delivered. :class:`OffsetTracker` keeps that per partition; it is pure bookkeeping, called
from the worker's loop thread only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["OffsetTracker"]


@dataclass
class _PartitionOffsets:
    epoch: int
    #: Offsets whose task has not finished (running, waiting, or held as unserved).
    running: set[int] = field(default_factory=set)
    #: Offsets with records not delivered yet, and how many of them each has.
    unsent: dict[int, int] = field(default_factory=dict)
    next_offset: int | None = None
    committed: int | None = None

    def committable(self) -> int | None:
        """Lowest offset not settled (running, or with undelivered records), else one past
        the last consumed record."""
        if self.running or self.unsent:
            return min(self.running | self.unsent.keys())
        return self.next_offset


class OffsetTracker:
    """Per partition: which consumed offsets are not settled yet, and how far it is safe to
    commit.

    An offset is settled once its task finished *and* every record produced for it was
    delivered (:meth:`hold` / :meth:`delivered`); the commit stops at the lowest offset that
    is not, however the tasks after it finish. ``epoch`` changes whenever a partition is
    (re)assigned or dropped, so that a task that finishes (or a record that is delivered)
    after its partition moved away is recognised and ignored.
    """

    def __init__(self) -> None:
        self._parts: dict[int, _PartitionOffsets] = {}
        self._epochs = 0

    def assign(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self._epochs += 1
            self._parts[p] = _PartitionOffsets(self._epochs)

    def drop(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self._parts.pop(p, None)

    def partitions(self) -> list[int]:
        return sorted(self._parts)

    def consumed(self, partition: int, offset: int) -> int | None:
        """Record a consumed offset as open; returns the partition's epoch, or None when the
        partition is not assigned (a record that raced its partition's revocation)."""
        part = self._parts.get(partition)
        if part is None:
            return None
        part.running.add(offset)
        if part.next_offset is None or offset + 1 > part.next_offset:
            part.next_offset = offset + 1
        return part.epoch

    def done(self, partition: int, offset: int, epoch: int) -> bool:
        """Close an offset's task; False when it belongs to an older epoch (drop its output)."""
        part = self._current(partition, epoch)
        if part is None:
            return False
        part.running.discard(offset)
        return True

    def hold(self, partition: int, offset: int, epoch: int) -> bool:
        """One more record of this offset is on its way: keep the offset open until it is
        delivered. False (nothing held) for an older epoch."""
        part = self._current(partition, epoch)
        if part is None:
            return False
        part.unsent[offset] = part.unsent.get(offset, 0) + 1
        return True

    def delivered(self, partition: int, offset: int, epoch: int) -> bool:
        """One record of this offset was delivered; False for an older epoch (or a record
        that held nothing)."""
        part = self._current(partition, epoch)
        if part is None or offset not in part.unsent:
            return False
        left = part.unsent[offset] - 1
        if left > 0:
            part.unsent[offset] = left
        else:
            del part.unsent[offset]
        return True

    @property
    def unsent(self) -> int:
        """Records not delivered yet, over all partitions."""
        return sum(sum(part.unsent.values()) for part in self._parts.values())

    def _current(self, partition: int, epoch: int) -> _PartitionOffsets | None:
        part = self._parts.get(partition)
        return part if part is not None and part.epoch == epoch else None

    def is_current(self, partition: int, epoch: int) -> bool:
        return self._current(partition, epoch) is not None

    def caught_up(self, positions: Mapping[int, int]) -> None:
        """The consumer's positions, read right after a poll whose records were all taken:
        a partition with everything settled may commit up to its position. The position
        passes the transaction markers after the last task (they are no records), so the
        committed offset meets the log end and an idle worker's lag reads 0, not 1."""
        for p, position in positions.items():
            part = self._parts.get(p)
            if part is None or part.running or part.unsent or position < 0:
                continue
            if part.next_offset is None or position > part.next_offset:
                part.next_offset = position

    def to_commit(self) -> dict[int, int]:
        """Offsets (next to read) that moved past what was last committed."""
        out: dict[int, int] = {}
        for p, part in self._parts.items():
            target = part.committable()
            if target is not None and (part.committed is None or target > part.committed):
                out[p] = target
        return out

    def committed(self, offsets: Mapping[int, int]) -> None:
        for p, offset in offsets.items():
            part = self._parts.get(p)
            if part is not None:
                part.committed = offset

    def commit_failed(self, partitions: Iterable[int]) -> None:
        """A commit of these partitions failed: commit them again next time."""
        for p in partitions:
            part = self._parts.get(p)
            if part is not None:
                part.committed = None
