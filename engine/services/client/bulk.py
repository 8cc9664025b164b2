"""Bulk operations: one command per instance that matches a filter, resumable after a crash.

A job reads every instance's latest status in instance-id order, one at a time (the CLI
folds the status topic on disk and reads the fold back in key order:
``engine.adapters.status_scan``, as ``list`` does), keeps the instances its filter matches,
and sends each one command, at most ``rate`` per second. Its memory is bounded whatever
the namespace holds: one status at a time, and at most ``window`` commands whose answers it
has not collected yet (it waits for the oldest before it sends more). Two things make it
safe to run again after it was killed:

- every command carries a request id made of the job id and the instance id
  (:func:`request_id`), so a command sent twice is applied once (the processor answers the
  second as a duplicate of the first, within its ``dedup_window_ms``);
- the job's *position*, the last instance id it handled, is saved after each command is
  written (:class:`PositionFile`), so ``--job-id`` resumes after it instead of starting
  over. The position is a small JSON file, replaced atomically: a job runs on one
  operator's machine and resumes there, and a file needs no topic, no ACL and no reader;
  the request ids cover the one instance a crash between writing a command and saving the
  position can repeat.

The answers come from the command-outcomes topic (the futures of the client's outcome
reader), and the job ends with a :class:`Summary`: applied, refused by error, timed out.

The filter is a list of predicates over ``InstanceStatus`` (:class:`BulkFilter`); a new
criterion is one more predicate there and one more option in the CLI.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from engine.core.errors import CommandTimeoutError, ConfigurationError
from engine.core.history import RuntimeStatus
from engine.core.messages import (
    CancelWorkflow,
    CommandOutcome,
    CommandResult,
    InstanceStatus,
    Message,
    PurgeWorkflow,
    ResetTarget,
    ResumeWorkflow,
    SuspendWorkflow,
    TerminateWorkflow,
)
from engine.services.client.commands import reset_command
from engine.services.client.listing import ENGINE_ROW_PREFIX

__all__ = [
    "OPERATIONS",
    "BulkFilter",
    "BulkJob",
    "JobSpec",
    "Position",
    "PositionFile",
    "Summary",
    "request_id",
]

#: The operations a job can apply, each a function (instance id, spec, request id) -> command.
OPERATIONS: dict[str, Callable[[str, JobSpec, str], Message]] = {}


def _operation(name: str) -> Callable[[Callable[[str, JobSpec, str], Message]], Any]:
    def add(fn: Callable[[str, JobSpec, str], Message]) -> Any:
        OPERATIONS[name] = fn
        return fn

    return add


@_operation("terminate")
def _terminate(instance_id: str, spec: JobSpec, rid: str) -> Message:
    return TerminateWorkflow(instance_id, spec.reason, False, rid)


@_operation("cancel")
def _cancel(instance_id: str, spec: JobSpec, rid: str) -> Message:
    return CancelWorkflow(instance_id, spec.reason, rid)


@_operation("suspend")
def _suspend(instance_id: str, spec: JobSpec, rid: str) -> Message:
    return SuspendWorkflow(instance_id, spec.reason, rid)


@_operation("resume")
def _resume(instance_id: str, spec: JobSpec, rid: str) -> Message:
    return ResumeWorkflow(instance_id, spec.reason, rid)


@_operation("purge")
def _purge(instance_id: str, spec: JobSpec, rid: str) -> Message:
    return PurgeWorkflow(instance_id, rid)


@_operation("reset")
def _reset(instance_id: str, spec: JobSpec, rid: str) -> Message:
    return reset_command(instance_id, ResetTarget(spec.reset_to), spec.reason, "", rid)


def request_id(job_id: str, instance_id: str) -> str:
    """The same for every run of the job on the instance: a repeat is applied once."""
    return f"bulk:{job_id}:{instance_id}"


# --- the filter -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BulkFilter:
    """Which instances a job touches; every criterion given must hold (times: epoch ms).
    ``ended_*`` match only instances that ended (their last update is the end)."""

    statuses: tuple[RuntimeStatus, ...] = ()
    name: str = ""
    version: str | None = None
    #: (key, value) pairs, sorted: every one must be among the instance's tags.
    tags: tuple[tuple[str, str], ...] = ()
    created_before: int | None = None
    created_after: int | None = None
    ended_before: int | None = None
    ended_after: int | None = None

    def predicates(self) -> list[Callable[[InstanceStatus], bool]]:
        # the engine's own rows (schedules, concurrency slots) are not instances
        checks: list[Callable[[InstanceStatus], bool]] = [
            lambda s: not s.instance_id.startswith(ENGINE_ROW_PREFIX)
        ]
        if self.statuses:
            checks.append(lambda s: s.status in self.statuses)
        if self.name:
            checks.append(lambda s: s.name == self.name)
        if self.version is not None:
            checks.append(lambda s: s.version == self.version)
        if self.tags:
            checks.append(lambda s: all(s.tags.get(k) == v for k, v in self.tags))
        if self.created_before is not None:
            checks.append(lambda s: s.created_ms < self.created_before)  # type: ignore[operator]
        if self.created_after is not None:
            checks.append(lambda s: s.created_ms > self.created_after)  # type: ignore[operator]
        if self.ended_before is not None or self.ended_after is not None:
            checks.append(self._ended_in_range)
        return checks

    def _ended_in_range(self, s: InstanceStatus) -> bool:
        if not s.status.is_terminal:
            return False
        before, after = self.ended_before, self.ended_after
        return (before is None or s.last_updated_ms < before) and (
            after is None or s.last_updated_ms > after
        )

    def matching(self, statuses: Iterable[InstanceStatus]) -> list[str]:
        """The matching instance ids, in the order a job handles them (by id)."""
        checks = self.predicates()
        return sorted(s.instance_id for s in statuses if all(check(s) for check in checks))

    def scan(self, statuses: Iterable[InstanceStatus]) -> Iterator[str]:
        """The matching ids of ``statuses``, which come in instance-id order (each once),
        read one at a time; ConfigurationError when the order is broken."""
        checks = self.predicates()
        previous: str | None = None
        for status in statuses:
            instance_id = status.instance_id
            if previous is not None and instance_id <= previous:
                raise ConfigurationError(
                    f"a bulk job reads statuses in instance-id order, each once, but "
                    f"{instance_id!r} came after {previous!r}; fold the status topic first "
                    f"(engine.adapters.status_scan.StatusFold) or sort them by instance_id"
                )
            previous = instance_id
            if all(check(status) for check in checks):
                yield instance_id


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a job does; saved with its position so a resume does the same."""

    operation: str
    filter: BulkFilter = field(default_factory=BulkFilter)
    reason: str = ""
    #: For ``reset``: a ResetTarget name (a sequence number means nothing across instances).
    reset_to: str = ResetTarget.LAST_FAILURE.value

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise ConfigurationError(
                f"unknown bulk operation {self.operation!r}; use one of {', '.join(OPERATIONS)}"
            )
        if self.reset_to not in (ResetTarget.LAST_FAILURE, ResetTarget.FIRST_TURN):
            raise ConfigurationError(
                f"a bulk reset goes to LAST_FAILURE or FIRST_TURN, not {self.reset_to!r}"
            )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["filter"]["statuses"] = [s.value for s in self.filter.statuses]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobSpec:
        raw = dict(data["filter"])
        raw["statuses"] = tuple(RuntimeStatus(s) for s in raw.get("statuses", ()))
        raw["tags"] = tuple((str(k), str(v)) for k, v in raw.get("tags", ()))
        return cls(data["operation"], BulkFilter(**raw), data["reason"], data["reset_to"])


# --- the position -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Position:
    """Where a job is: its spec, the last instance id it handled, how many commands it
    sent, and when it started (epoch ms: relative times like ``7d`` are resolved against
    it, so a resumed job matches what it matched before)."""

    spec: JobSpec
    last: str
    sent: int
    started_ms: int


class PositionFile:
    """A job's :class:`Position`, in ``<dir>/<job id>.json``."""

    def __init__(self, directory: Path, job_id: str) -> None:
        if not job_id or any(c in job_id for c in "/\\\x00") or job_id.startswith("."):
            raise ConfigurationError(
                f"job id {job_id!r} cannot name a file; use letters, digits, '-' and '_'"
            )
        self.path = directory / f"{job_id}.json"

    def load(self) -> Position | None:
        """The saved position, or None for a new job."""
        try:
            data = json.loads(self.path.read_text())
            spec = JobSpec.from_json(data["spec"])
            return Position(spec, str(data["last"]), int(data["sent"]), int(data["started_ms"]))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigurationError(
                f"the position file {self.path} is unreadable ({exc}); delete it to start "
                f"the job over (its request ids keep done commands from applying twice)"
            ) from exc

    def save(self, position: Position) -> None:
        """Replace the file atomically (a crash leaves the old or the new position)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        data = {
            "spec": position.spec.to_json(),
            "last": position.last,
            "sent": position.sent,
            "started_ms": position.started_ms,
        }
        with tmp.open("w") as out:
            json.dump(data, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)


# --- running a job ----------------------------------------------------------------------------


class CommandPort(Protocol):
    """What a job needs of a client (``engine.client.Client``, or the test engine's)."""

    def send_expecting(self, command: Message) -> Future[CommandOutcome] | None: ...

    def answer(
        self, request_id: str, future: Future[CommandOutcome], timeout_s: float
    ) -> CommandOutcome: ...

    def flush(self) -> None: ...


#: The position is saved after this many commands or this many seconds, whichever comes
#: first; each save follows a flush, so a saved position never names a command that did
#: not reach the broker (a crash repeats at most the commands since the last save).
SAVE_EVERY = 50
SAVE_EVERY_S = 1.0
#: Commands a job keeps in flight: with this many unanswered it collects the oldest answer
#: before it sends the next command, so its memory does not grow with the matches.
ANSWER_WINDOW = 1000


@dataclass(slots=True)
class Summary:
    """How the job's commands were answered (this run's commands only)."""

    matched: int = 0
    skipped: int = 0
    sent: int = 0
    applied: int = 0
    duplicates: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    timed_out: int = 0

    def count(self, outcome: CommandOutcome) -> None:
        if outcome.result is CommandResult.REFUSED:
            self.refused[outcome.error] = self.refused.get(outcome.error, 0) + 1
        elif outcome.duplicate:
            self.duplicates += 1
        else:
            self.applied += 1

    def lines(self) -> list[str]:
        out = [
            f"matched {self.matched}, skipped {self.skipped} handled before, sent {self.sent}",
            f"applied {self.applied}",
        ]
        if self.duplicates:
            out.append(f"already applied {self.duplicates} (sent again after a restart)")
        out += [f"refused {n}: {error}" for error, n in sorted(self.refused.items())]
        out.append(f"timed out {self.timed_out}")
        return out


class BulkJob:
    """Sends the job's commands and collects their answers.

    ``held_peak`` is the most commands it ever held unanswered at once (what a test counts
    to show that its memory is bounded by ``window``, not by the matches).
    """

    def __init__(
        self,
        job_id: str,
        spec: JobSpec,
        port: CommandPort,
        position: PositionFile,
        *,
        started_ms: int = 0,
        rate: float = 0.0,
        progress: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        window: int = ANSWER_WINDOW,
    ) -> None:
        self.job_id = job_id
        self.spec = spec
        self.port = port
        self.position = position
        self.started_ms = started_ms
        self.rate = rate
        self.progress = progress
        self.window = max(1, window)
        self._clock = clock
        self._sleep = sleep
        self._pending: deque[tuple[str, Future[CommandOutcome], float]] = deque()
        self.held_peak = 0
        self.answered = 0

    def run(self, statuses: Iterable[InstanceStatus], answer_timeout_s: float) -> Summary:
        """Send the job's commands to the matches among ``statuses`` (every instance's
        latest status in instance-id order, each once; read one at a time) past the saved
        position; each answer is awaited up to ``answer_timeout_s`` after its command was
        sent, or after the last one was."""
        last, sent_before = self._resume()
        summary = Summary()
        pace = _Pace(self.rate, self._clock, self._sleep)
        shown = saved = self._clock()
        unsaved = ""
        for instance_id in self.spec.filter.scan(statuses):
            summary.matched += 1
            if instance_id <= last:
                summary.skipped += 1
                continue
            pace.wait()
            self._send(instance_id, answer_timeout_s, summary)
            unsaved = instance_id
            if self._clock() - saved >= SAVE_EVERY_S or summary.sent % SAVE_EVERY == 0:
                saved = self._save(unsaved, sent_before + summary.sent)
                unsaved = ""
            if self._clock() - shown >= 1.0:
                shown = self._clock()
                self._show(f"{summary.sent} sent, last {instance_id}")
        if unsaved:
            self._save(unsaved, sent_before + summary.sent)
        if summary.sent:
            self._show(f"{summary.sent} sent of {summary.matched} matches")
        self._collect(summary, until_empty=True, timeout_s=answer_timeout_s)
        return summary

    def _resume(self) -> tuple[str, int]:
        """The last instance handled and the commands sent before (a new job: "", 0)."""
        saved = self.position.load()
        if saved is None:
            return "", 0
        if saved.spec != self.spec:
            raise ConfigurationError(
                f"job {self.job_id!r} was started with other options "
                f"({json.dumps(saved.spec.to_json())}); resume it with the same options "
                f"or choose a new --job-id"
            )
        self.started_ms = saved.started_ms
        return saved.last, saved.sent

    def _send(self, instance_id: str, timeout_s: float, summary: Summary) -> None:
        if len(self._pending) >= self.window:
            self._collect(summary, until_empty=False, timeout_s=timeout_s)
        rid = request_id(self.job_id, instance_id)
        command = OPERATIONS[self.spec.operation](instance_id, self.spec, rid)
        future = self.port.send_expecting(command)
        if future is not None:
            self._pending.append((rid, future, self._clock() + timeout_s))
            self.held_peak = max(self.held_peak, len(self._pending))
        summary.sent += 1

    def _save(self, last: str, sent: int) -> float:
        self.port.flush()
        self.position.save(Position(self.spec, last, sent, self.started_ms))
        return self._clock()

    def _collect(self, summary: Summary, *, until_empty: bool, timeout_s: float) -> None:
        """Count the oldest answers: until the window has room, or all of them (each
        waits until its command's deadline, at the end at least ``timeout_s`` from now)."""
        if self._pending:
            self.port.flush()  # an answer can only come for a command on the broker
        floor = self._clock() + timeout_s if until_empty else 0.0
        collected = 0
        while self._pending and (until_empty or len(self._pending) >= self.window):
            rid, future, deadline = self._pending.popleft()
            wait = max(deadline, floor) - self._clock()
            try:
                summary.count(self.port.answer(rid, future, max(0.0, wait)))
            except CommandTimeoutError:
                summary.timed_out += 1
            collected += 1
        self.answered += collected
        if until_empty and self.answered:
            self._show(f"{self.answered} answers collected")

    def _show(self, line: str) -> None:
        if self.progress is not None:
            print(
                f"bulk {self.spec.operation} {self.job_id}: {line}", file=self.progress, flush=True
            )


class _Pace:
    """At most ``rate`` calls of :meth:`wait` per second (0: no limit)."""

    def __init__(
        self, rate: float, clock: Callable[[], float], sleep: Callable[[float], None]
    ) -> None:
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._clock = clock
        self._sleep = sleep
        self._next = clock()

    def wait(self) -> None:
        if not self._interval:
            return
        delay = self._next - self._clock()
        if delay > 0:
            self._sleep(delay)
        self._next = max(self._next, self._clock()) + self._interval
