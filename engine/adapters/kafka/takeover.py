"""Taking partitions over beside the work on the others.

A replica assigned new partitions must fence their departed owner and restore their tables
before it may process them. Done inside the rebalance callback, on the processor's one
thread, that stopped every partition the replica already had for as long as the takeover
took (1.4-1.7 s for a few thousand changelog records on two busy cores): with the consumer
group protocol, the only pause a rebalance left the partitions that did not move.

Here the rebalance callback only pauses the new partitions and hands them to a thread of
their own, which fences and restores them (its own producer and restore consumer; the
processor's consumer and transactional producer stay on the processor's thread). The
processor keeps running batches on the other partitions and, between batches, adopts the
partitions whose takeover finished: it opens them for processing and resumes their fetch.
Until then no record of theirs is fetched, so none can be processed or committed early;
a revocation, a stop or a failure cancels the takeover and closes what it opened.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from engine.adapters.kafka.restore import RestoreReport

__all__ = ["Takeover", "TakeoverDone"]

log = logging.getLogger(__name__)


class Closeable(Protocol):
    """What a taken-over partition is to this module: something to close on cancel."""

    def close(self) -> None: ...


P = TypeVar("P", bound=Closeable)


@dataclass
class TakeoverDone(Generic[P]):
    """A finished takeover: the opened partitions, the restore's report, or its error."""

    partitions: dict[int, P]
    report: RestoreReport | None = None
    error: BaseException | None = None


class Takeover(Generic[P]):
    """One batch of new partitions being fenced and restored on a thread of its own.

    ``fence()`` aborts what the departed owners left open; ``open_partition(p)`` opens a
    partition; ``restore(opened, stop)`` brings their tables to the committed end (raising
    when ``stop`` is set first)."""

    def __init__(
        self,
        partitions: list[int],
        *,
        fence: Callable[[], object],
        open_partition: Callable[[int], P],
        restore: Callable[[Mapping[int, P], threading.Event], RestoreReport],
    ) -> None:
        self.partitions = sorted(partitions)
        self._fence = fence
        self._open = open_partition
        self._restore = restore
        self._cancel = threading.Event()
        self._opened: dict[int, P] = {}
        self._done: TakeoverDone[P] | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"takeover-{self.partitions}", daemon=True
        )

    def start(self) -> Takeover[P]:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._fence()
            for p in self.partitions:
                if self._cancel.is_set():
                    break
                self._opened[p] = self._open(p)
            report = self._restore(self._opened, self._cancel)
            self._done = TakeoverDone(dict(self._opened), report)
        except BaseException as exc:  # handed to the processor's thread, which raises it
            self._done = TakeoverDone(dict(self._opened), error=exc)

    def finished(self) -> TakeoverDone[P] | None:
        """The outcome once the thread ended, else None (never blocks)."""
        if self._thread.is_alive():
            return None
        self._thread.join()
        return self._done

    def cancel(self, timeout_s: float) -> None:
        """Stop the takeover, wait for its thread, and close what it opened: the partitions
        moved on, or the replica stops."""
        self._cancel.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():  # pragma: no cover - a restore ignoring its stop flag
            log.warning("the takeover of partitions %s did not stop in time", self.partitions)
            return
        for pp in self._opened.values():
            pp.close()
        self._opened.clear()
