"""Commit after delivery: whatever order tasks finish in and whichever deliveries fail, the
worker never commits past a task that is unfinished or has a record not yet delivered."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.services.worker.worker import OffsetTracker


@dataclass
class _Task:
    offset: int
    records: int
    finished: bool = False
    #: Records produced and not acknowledged (failed ones are produced again).
    unsent: int = 0
    delivered: int = 0

    @property
    def settled(self) -> bool:
        return self.finished and self.unsent == 0


@dataclass
class _Partition:
    tasks: list[_Task]
    epoch: int
    committed: int | None = None
    events: list[str] = field(default_factory=list)


def _lowest_unsettled(part: _Partition) -> int | None:
    open_ = [t.offset for t in part.tasks if not t.settled]
    return min(open_) if open_ else None


def _check(tracker: OffsetTracker, parts: dict[int, _Partition]) -> None:
    """What may be committed never passes an unsettled task, and reaches the end when all
    are settled."""
    for p, target in tracker.to_commit().items():
        part = parts[p]
        lowest = _lowest_unsettled(part)
        if lowest is not None:
            assert target <= lowest, (p, target, lowest, part.events)
        else:
            assert target == part.tasks[-1].offset + 1, (p, target, part.events)
    for p, part in parts.items():
        if _lowest_unsettled(part) is None and part.tasks:
            want = part.tasks[-1].offset + 1
            assert part.committed == want or tracker.to_commit().get(p) == want


def _step(data: st.DataObject, tracker: OffsetTracker, parts: dict[int, _Partition]) -> bool:
    """One random event: a task finishes (producing its records), a record is delivered,
    a delivery fails (the record is produced again), or a commit happens. False when
    nothing is left to do."""
    moves: list[tuple[str, int, _Task]] = []
    for p, part in parts.items():
        for t in part.tasks:
            if not t.finished:
                moves.append(("finish", p, t))
            if t.unsent:
                moves += [("deliver", p, t), ("fail", p, t)]
    if not moves:
        return False
    kind, p, task = data.draw(st.sampled_from(moves))
    part = parts[p]
    part.events.append(f"{kind} {task.offset}")
    if kind == "finish":
        for _ in range(task.records):  # held before the task is done, as Worker does
            assert tracker.hold(p, task.offset, part.epoch)
        task.unsent += task.records
        task.finished = True
        assert tracker.done(p, task.offset, part.epoch)
    elif kind == "deliver":
        assert tracker.delivered(p, task.offset, part.epoch)
        task.unsent -= 1
        task.delivered += 1
    # "fail": the record stays held and is produced again: nothing changes in the tracker
    if data.draw(st.booleans()):
        offsets = tracker.to_commit()
        _check(tracker, parts)
        tracker.committed(offsets)
        for q, offset in offsets.items():
            parts[q].committed = offset
    _check(tracker, parts)
    return True


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    layout=st.lists(
        st.lists(st.tuples(st.integers(1, 3), st.integers(0, 2)), min_size=1, max_size=8),
        min_size=1,
        max_size=3,
    ),
)
def test_commits_never_pass_an_unfinished_or_undelivered_task(
    data: st.DataObject, layout: list[list[tuple[int, int]]]
) -> None:
    tracker = OffsetTracker()
    tracker.assign(range(len(layout)))
    parts: dict[int, _Partition] = {}
    for p, tasks in enumerate(layout):
        offset, made = 0, []
        for gap, records in tasks:  # gaps: transaction markers between task records
            offset += gap
            epoch = tracker.consumed(p, offset)
            assert epoch is not None
            made.append(_Task(offset, records))
        parts[p] = _Partition(made, epoch)
    _check(tracker, parts)
    while _step(data, tracker, parts):
        pass
    assert tracker.unsent == 0
    expected = {p: part.tasks[-1].offset + 1 for p, part in parts.items()}
    final = {**{p: part.committed for p, part in parts.items()}, **tracker.to_commit()}
    assert final == expected


@settings(max_examples=100, deadline=None)
@given(data=st.data(), records=st.lists(st.integers(0, 2), min_size=1, max_size=6))
def test_a_partition_moved_away_settles_nothing_of_its_old_assignment(
    data: st.DataObject, records: list[int]
) -> None:
    """Acknowledgements and completions that arrive after a revocation (or a reassignment)
    belong to the old epoch: they never let the new assignment commit past its own tasks."""
    tracker = OffsetTracker()
    tracker.assign([0])
    old = [tracker.consumed(0, o) for o in range(len(records))]
    for o, n in enumerate(records):
        for _ in range(n):
            tracker.hold(0, o, old[o] or 0)
    tracker.drop([0])
    if data.draw(st.booleans()):
        tracker.assign([0])
        new = tracker.consumed(0, 0)
        assert new is not None and new != old[0]
    for o in data.draw(st.permutations(range(len(records)))):
        assert not tracker.done(0, o, old[o] or 0)
        assert not tracker.delivered(0, o, old[o] or 0)
    assert tracker.to_commit() in ({}, {0: 0}), "only the new assignment's own task counts"
