"""A takeover fences, opens and restores new partitions on a thread of its own; the
processor adopts them once it finished, and a revocation cancels it and closes what it
opened (engine.adapters.kafka.takeover, without a broker)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from engine.adapters.kafka.restore import RestoreInterrupted, RestoreReport
from engine.adapters.kafka.takeover import Takeover


class Opened:
    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _wait(takeover: Takeover[Opened]) -> None:
    deadline = time.monotonic() + 10
    while takeover.finished() is None:
        assert time.monotonic() < deadline, "the takeover never finished"
        time.sleep(0.005)


def test_a_finished_takeover_hands_over_its_partitions_fenced_and_restored() -> None:
    steps: list[str] = []

    def restore(opened: Mapping[int, Opened], stop: threading.Event) -> RestoreReport:
        steps.append(f"restore {sorted(opened)}")
        return RestoreReport(records=7)

    takeover = Takeover(
        [3, 1],
        fence=lambda: steps.append("fence"),
        open_partition=Opened,
        restore=restore,
    ).start()
    _wait(takeover)
    done = takeover.finished()
    assert done is not None and done.error is None and done.report is not None
    assert steps == ["fence", "restore [1, 3]"]  # fenced before anything is read
    assert sorted(done.partitions) == [1, 3] and done.report.records == 7
    assert not any(pp.closed for pp in done.partitions.values())


def test_a_cancelled_takeover_stops_its_restore_and_closes_what_it_opened() -> None:
    started = threading.Event()
    opened: list[Opened] = []

    def open_partition(p: int) -> Opened:
        opened.append(Opened(p))
        return opened[-1]

    def restore(parts: Mapping[int, Opened], stop: threading.Event) -> RestoreReport:
        started.set()
        if stop.wait(10):
            raise RestoreInterrupted("asked to stop")
        return RestoreReport()

    takeover = Takeover([0, 2], fence=lambda: None, open_partition=open_partition, restore=restore)
    takeover.start()
    assert started.wait(10)
    assert takeover.finished() is None  # still restoring: never blocks the caller
    takeover.cancel(10)
    assert [pp.closed for pp in opened] == [True, True]


def test_a_failed_takeover_reports_its_error_and_what_it_opened() -> None:
    def restore(parts: Mapping[int, Opened], stop: threading.Event) -> RestoreReport:
        raise OSError("the local state folder is gone")

    takeover = Takeover([5], fence=lambda: None, open_partition=Opened, restore=restore).start()
    _wait(takeover)
    done = takeover.finished()
    assert done is not None and isinstance(done.error, OSError)
    assert list(done.partitions) == [5]
