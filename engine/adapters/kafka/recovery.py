"""How far an engine process goes to recover from Kafka failures by itself.

A processor replica that was fenced (it stalled past the transaction timeout, or another
process took over its transactional id), whose producer died, or whose broker went away,
recreates its Kafka clients and rejoins its group instead of exiting: a supervisor would only
do the same, later. The bounds keep that from turning into a silent loop: a replica that
keeps failing gives up with an error that says what to check - for example two processes
started with the same replica id fence each other again and again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from engine.core.errors import BrokerError

__all__ = ["Recovery"]

log = logging.getLogger("engine.recovery")


class Recovery:
    """Counts a process's recoveries and says when to give up, and how long to wait first.

    Gives up after more than ``limit`` recoveries within ``window_s``, or when the failures
    went on for longer than ``give_up_s`` without any progress in between (a broker outage
    longer than that). Waits grow from ``first_backoff_s``, doubling, to ``max_backoff_s``.
    """

    def __init__(
        self,
        name: str,
        *,
        limit: int = 10,
        window_s: float = 600.0,
        give_up_s: float = 300.0,
        first_backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.limit = limit
        self.window_s = window_s
        self.give_up_s = give_up_s
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self._clock = clock
        self._recoveries: list[float] = []
        self._failing_since: float | None = None
        self._attempts = 0
        #: The progress counter's last value (processes start counting at 0).
        self._marker = 0

    @property
    def recoveries(self) -> int:
        """Recoveries within the current window."""
        return len(self._recoveries)

    def failed(self, cause: BaseException, *, again: bool = False) -> None:
        """Note a failure that the process is about to recover from (``again``: a further
        attempt of the same recovery, which only counts against ``give_up_s``); raises
        :class:`BrokerError` (from ``cause``) once the bounds are used up."""
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
        self._recoveries = [t for t in self._recoveries if now - t < self.window_s]
        if not again or not self._recoveries:
            self._recoveries.append(now)
        self._attempts += 1
        failing_s = now - self._failing_since
        if len(self._recoveries) > self.limit or failing_s > self.give_up_s:
            raise BrokerError(
                f"{self.name} gives up: {len(self._recoveries) - 1} recoveries in the last "
                f"{self.window_s / 60:.0f} minutes, failing for {failing_s:.0f}s; last error: "
                f"{cause}. Check that the brokers are up and reachable, and that no other "
                f"process runs with the same id (each one fences the other)."
            ) from cause
        log.error(
            "%s: %s; recreating its Kafka clients and rejoining its group (recovery %d of at "
            "most %d in %.0f minutes, next try in %.1fs)",
            self.name,
            cause,
            len(self._recoveries),
            self.limit,
            self.window_s / 60,
            self.backoff_s(),
        )

    def backoff_s(self) -> float:
        """How long to wait before the next attempt (0 before the first failure)."""
        if self._attempts == 0:
            return 0.0
        return min(self.first_backoff_s * 2.0 ** (self._attempts - 1), self.max_backoff_s)

    def succeeded(self, marker: int) -> None:
        """Note progress: ``marker`` is a counter of work done (transactions committed,
        partitions restored); when it moved since the last call, the failures are over."""
        if marker != self._marker:
            if self._failing_since is not None:
                log.info("%s works again", self.name)
            self._marker = marker
            self._failing_since = None
            self._attempts = 0
