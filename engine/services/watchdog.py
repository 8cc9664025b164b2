"""The turn watchdog: a CPU-time budget per turn, enforced from outside workflow code.

A turn runs in the processor's own thread (no hand-off per turn, so no added latency). A
watchdog thread, one per processor, looks at the running turn a few times per budget; when
the turn's thread has used more CPU time than the budget (or three times the budget of wall
time, for code blocked in a C call), it raises :class:`~engine.runtime.interrupt.TurnTimedOut`
in that thread with ``PyThreadState_SetAsyncExc``. The interpreter delivers it at the next
bytecode boundary, so ``while True: pass`` and endless awaits of resolved tasks stop; the
exception is a ``BaseException`` the workflow driver lets through, and it is raised again
every tick while the turn keeps running, so code that catches it once still stops. (Code
that catches ``BaseException`` inside an endless loop of its own defeats any in-process
interrupt; the watchdog then keeps interrupting and logging it.)

Why this is safe:

- It is only ever raised while a turn is *armed*: arming covers replaying or stepping one
  execution and nothing else; the processor discards that execution afterwards and fails
  the instance, so no engine state is left half-updated (turns record their output only
  after the step returns).
- Disarming takes the same lock as firing, then clears any interrupt still pending for the
  thread (``PyThreadState_SetAsyncExc(tid, NULL)``), so no interrupt ever lands after
  :meth:`TurnWatchdog.run` has returned.
- No signals are involved, so it works in any thread (tests run replicas in threads) and
  leaves SIGTERM to the process; the main thread's signal handler still runs between
  bytecodes of a spinning turn, and the turn ends within the budget, so a replica answers
  SIGTERM. No Kafka transaction is open while turns run, and librdkafka heartbeats from its
  own threads, so the group keeps the replica.

Code blocked inside one C call (``time.sleep``, a socket read) is interrupted only when
that call returns: the budget bounds Python work, not arbitrary blocking.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from engine.core.errors import WorkflowTurnTimeoutError
from engine.runtime.interrupt import TurnTimedOut

log = logging.getLogger("engine.processor")

T = TypeVar("T")

#: Wall-clock allowance, as a multiple of the CPU budget (for a thread starved of CPU).
WALL_FACTOR = 3.0

#: A replay may take one turn budget per this many events (it re-runs every recorded turn,
#: and each of them fitted the budget when it ran).
REPLAY_EVENTS_PER_BUDGET = 1000

_SET_ASYNC_EXC = ctypes.pythonapi.PyThreadState_SetAsyncExc


def _raise_in(ident: int, exc: type[BaseException] | None) -> None:
    """Make thread ``ident`` raise ``exc`` at its next bytecode (None: clear a pending one)."""
    _SET_ASYNC_EXC(ctypes.c_ulong(ident), None if exc is None else ctypes.py_object(exc))


def _thread_cpu_clock(ident: int) -> Callable[[], float]:
    """A clock of the CPU time of thread ``ident``, readable from any thread."""
    try:
        clock_id = time.pthread_getcpuclockid(ident)
    except (AttributeError, OSError):  # pragma: no cover - not Linux: fall back to wall time
        return time.monotonic
    return lambda: time.clock_gettime(clock_id)


class _Turn:
    """One armed call. Its thread's CPU clock is found and first read by the watchdog, at
    the first tick that sees the turn, not when the turn starts: both are system calls, and
    they would sit on every turn's path for a check that almost never fires. The budget so
    counts from that first tick, at most one tick late. (The thread is alive while its turn
    is armed: it is the one running it.)"""

    __slots__ = ("budget_s", "clock", "cpu0", "fired", "ident", "wall0", "what")

    def __init__(self, ident: int, what: str, budget_s: float) -> None:
        self.ident = ident
        self.budget_s = budget_s
        self.what = what
        self.fired = 0
        self.clock: Callable[[], float] | None = None
        self.cpu0 = 0.0
        self.wall0 = time.monotonic()


class TurnWatchdog:
    """Runs functions under a per-call CPU-time budget (``budget_ms <= 0``: no budget)."""

    def __init__(self, budget_ms: int) -> None:
        self.budget_s = budget_ms / 1000
        self.interrupts = 0
        self._lock = threading.Lock()
        self._armed: _Turn | None = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    def run(self, fn: Callable[[], T], what: str, *, scale: float = 1.0) -> T:
        """``fn()``; raises :class:`WorkflowTurnTimeoutError` when it ran past the budget
        (times ``scale``: a replay re-runs many turns, each of which fitted the budget)."""
        if self.budget_s <= 0:
            return fn()
        turn = self._arm(what, self.budget_s * max(scale, 1.0))
        try:
            try:
                return fn()
            finally:
                self._disarm(turn)
        except TurnTimedOut:
            while True:  # an interrupt may land inside _disarm itself: finish disarming
                try:
                    self._disarm(turn)
                    break
                except TurnTimedOut:
                    continue
            raise WorkflowTurnTimeoutError(
                f"{what} ran for more than the turn budget of {turn.budget_s * 1000:.0f} ms "
                f"of CPU time without waiting on anything durable; a loop that never awaits? "
                f"Move long computations into activities, or raise turn_budget_ms."
            ) from None

    def close(self) -> None:
        self._closed.set()

    # --- the processor's side -----------------------------------------------------------

    def _arm(self, what: str, budget_s: float) -> _Turn:
        ident = threading.get_ident()
        if self._thread is None:
            self._start()
        turn = _Turn(ident, what, budget_s)
        self._armed = turn
        return turn

    def _disarm(self, turn: _Turn) -> None:
        with self._lock:
            if self._armed is turn:
                self._armed = None
        if turn.fired:
            _raise_in(turn.ident, None)

    # --- the watchdog's side ------------------------------------------------------------

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="turn-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        tick = min(max(self.budget_s / 5, 0.01), 0.25)
        while not self._closed.wait(tick):
            turn = self._armed
            if turn is not None and self._over_budget(turn):
                self._fire(turn)

    def _over_budget(self, turn: _Turn) -> bool:
        if time.monotonic() - turn.wall0 >= turn.budget_s * WALL_FACTOR:
            return True
        try:
            if turn.clock is None:
                turn.clock = _thread_cpu_clock(turn.ident)
                turn.cpu0 = turn.clock()
                return False
            return turn.clock() - turn.cpu0 >= turn.budget_s
        except OSError:  # the thread ended meanwhile
            return False

    def _fire(self, turn: _Turn) -> None:
        with self._lock:
            if self._armed is not turn:
                return
            turn.fired += 1
            self.interrupts += 1
            _raise_in(turn.ident, TurnTimedOut)
        if turn.fired == 1:
            log.warning("interrupting %s: over the turn budget", turn.what)
        elif turn.fired % 100 == 0:
            log.error(
                "%s still runs after %d interrupts: its code catches BaseException in a loop; "
                "fix the workflow and restart this replica",
                turn.what,
                turn.fired,
            )
