"""Rebuild every instance's state from its history and compare it with the engine's state.

History is the record; the processor's instance rows (``m|id``) and history rows
(``h|id|seq``, changelogged on the state-changelog topic) and the status topic are derived
from it. If they disagree, something went wrong: a lost or partial write, a bug, a hand edit.

:class:`InstanceFold` folds one instance's events into what they imply (status, output,
failure, custom status, generation, next sequence, hash-chain tail, the current
generation's rows). :class:`ProcessorTables` folds changelog records (or RocksDB rows) into
the processor's view. :func:`compare` lists every difference.

Cases that are not differences:
- a purged instance: history remains, state row and status record are gone;
- a run that has not started (scheduled start, or terminated before it started): it has a
  row and a status record but no history of its own, so only the chain tail is compared;
- a row that only holds events raised before any start;
- a PARKED instance: its status record says PARKED with the error its code raised, while
  its history and row say RUNNING or SUSPENDED (a parked turn records nothing; parked on
  the first turn of a run, it has no history of that run yet).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine.core.failure import FailureDetails
from engine.core.history import (
    ContinuedAsNew,
    CustomStatusSet,
    ExecutionCompleted,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionSuspended,
    HistoryEvent,
    RuntimeStatus,
)
from engine.core.instance_row import InstanceRow
from engine.core.messages import InstanceStatus
from engine.core.payloads import Payload
from engine.core.schedules import SCHEDULE_PREFIX
from engine.runtime.jsonhistory import failure_to_json, payload_to_json
from engine.services.processor import keys
from engine.services.processor.history_rows import split_row
from engine.services.processor.meta import decode_meta

__all__ = [
    "AuditReport",
    "Difference",
    "InstanceFold",
    "ProcessorTables",
    "compare",
    "confirmed",
    "fold_histories",
]

_HASH_SIZE = 32
#: Statuses a row may have without history of its run: terminated or cancelled before
#: its scheduled start.
_NOT_STARTED = frozenset(
    {RuntimeStatus.PENDING, RuntimeStatus.TERMINATED, RuntimeStatus.CANCELLED, RuntimeStatus.PARKED}
)
_LIVE = frozenset({RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED})


# --- history ------------------------------------------------------------------------------


@dataclass(slots=True)
class InstanceFold:
    """What one instance's history adds up to (fed its events in order)."""

    events: int = 0
    status: RuntimeStatus | None = None
    name: str = ""
    version: str = ""
    first_generation: int = 0
    generation: int = 0
    output: Payload | None = None
    failure: FailureDetails | None = None
    custom_status: Payload | None = None
    next_sequence: int = 0
    last_hash: bytes = b""
    first_ms: int = 0
    last_ms: int = 0
    #: Hashes of the current generation's events (what the processor keeps as rows).
    rows: dict[int, bytes] = field(default_factory=dict)
    _after_continue: bool = False

    def apply(self, event: HistoryEvent) -> None:
        body = event.body
        if self.events == 0:
            self.first_generation, self.first_ms = event.generation, event.timestamp_ms
        if isinstance(body, ExecutionStarted):
            self._started(body, event.sequence)
        elif isinstance(body, ExecutionCompleted):
            self.status, self.output, self.failure = body.status, body.output, body.failure
        elif isinstance(body, ExecutionSuspended):
            self.status = RuntimeStatus.SUSPENDED
        elif isinstance(body, ExecutionResumed):
            self.status = RuntimeStatus.RUNNING
        elif isinstance(body, ContinuedAsNew):
            self.status = RuntimeStatus.CONTINUED_AS_NEW
        elif isinstance(body, CustomStatusSet):
            self.custom_status = body.status
        self._after_continue = isinstance(body, ContinuedAsNew)
        self.events += 1
        self.generation = event.generation
        self.next_sequence = event.sequence + 1
        self.last_hash = event.hash
        self.last_ms = event.timestamp_ms
        self.rows[event.sequence] = event.hash

    def _started(self, body: ExecutionStarted, sequence: int) -> None:
        """A new generation: continue-as-new keeps the custom status, a new run does not."""
        continued = self.status is RuntimeStatus.CONTINUED_AS_NEW
        self.status = RuntimeStatus.RUNNING
        self.name, self.version = body.name, body.version
        self.output = self.failure = None
        if not continued:
            self.custom_status = None
        if self._after_continue:
            # a continue-as-new that began the next generation in its own turn (histories
            # from before it ended the turn): the rows start at ExecutionStarted
            self.rows = {}
        else:
            # a generation begun by a turn of its own keeps rows from its TurnStarted on
            self.rows = {seq: h for seq, h in self.rows.items() if seq == sequence - 1}

    def to_json(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "status": None if self.status is None else self.status.value,
            "name": self.name,
            "version": self.version,
            "generations": [self.first_generation, self.generation],
            "output": payload_to_json(self.output),
            "failure": failure_to_json(self.failure),
            "custom_status": payload_to_json(self.custom_status),
            "next_sequence": self.next_sequence,
            "last_hash": self.last_hash.hex(),
            "first_ms": self.first_ms,
            "last_ms": self.last_ms,
        }


def fold_histories(
    events: Iterable[HistoryEvent], into: dict[str, InstanceFold] | None = None
) -> dict[str, InstanceFold]:
    """Fold events of many instances (in topic order); ``into`` continues an earlier fold."""
    folds = {} if into is None else into
    for event in events:
        fold = folds.get(event.instance_id)
        if fold is None:
            fold = folds[event.instance_id] = InstanceFold()
        fold.apply(event)
    return folds


# --- the processor's tables ---------------------------------------------------------------


class ProcessorTables:
    """The processor's instance rows and history rows, from changelog records or a database.

    Feed records in offset order; later values win and tombstones delete, as compaction and
    restoring do. Only the hash of each history event is kept, by sequence; a row holds the
    events of one turn (or one event, in rows of older processors: ``history_rows``).
    """

    def __init__(self) -> None:
        self.metas: dict[str, InstanceRow] = {}
        self.rows: dict[str, dict[int, bytes]] = {}
        self.undecodable: dict[str, str] = {}
        #: How many events the row at each (instance, first sequence) holds.
        self._sizes: dict[tuple[str, int], int] = {}

    def apply(self, key: bytes, value: bytes | None) -> None:
        prefix = key[:1]
        if prefix == keys.META:
            self._meta(key[1:].decode("utf-8", "replace"), value)
        elif prefix == keys.HISTORY and len(key) > 10 and key[-9:-8] == keys.SEP:
            self._row(key[1:-9].decode("utf-8", "replace"), keys.history_sequence(key), value)

    def _meta(self, instance_id: str, value: bytes | None) -> None:
        if value is None:
            self.metas.pop(instance_id, None)
            return
        try:
            self.metas[instance_id] = decode_meta(value)
            self.undecodable.pop(instance_id, None)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            self.undecodable[instance_id] = f"{type(exc).__name__}: {exc}"

    def _row(self, instance_id: str, sequence: int, value: bytes | None) -> None:
        rows = self.rows.setdefault(instance_id, {})
        for seq in range(sequence, sequence + self._sizes.pop((instance_id, sequence), 1)):
            rows.pop(seq, None)
        if value is not None:
            events = split_row(bytes(value))
            for offset, data in enumerate(events):
                rows[sequence + offset] = bytes(data[-_HASH_SIZE:])
            self._sizes[instance_id, sequence] = len(events)
        if not rows:
            del self.rows[instance_id]


# --- comparison ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Difference:
    """One field on which the engine's state disagrees with the history."""

    instance_id: str
    #: ``state`` (the processor's instance row), ``rows`` (its history rows) or ``status``.
    source: str
    field: str
    history: str
    found: str

    def to_json(self) -> dict[str, str]:
        return {
            "instance_id": self.instance_id,
            "source": self.source,
            "field": self.field,
            "history": self.history,
            "found": self.found,
        }

    def line(self) -> str:
        return (
            f"{self.instance_id}: {self.source}.{self.field}: history says {self.history}, "
            f"{self.source} has {self.found}"
        )


@dataclass(slots=True)
class AuditReport:
    instances: int = 0
    events: int = 0
    differences: list[Difference] = field(default_factory=list)
    purged: list[str] = field(default_factory=list)
    not_started: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "instances": self.instances,
            "events": self.events,
            "differences": [d.to_json() for d in self.differences],
            "purged": self.purged,
            "not_started": self.not_started,
        }


def _text(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, Payload):
        shown = payload_to_json(value)
        return repr(shown["json"]) if "json" in shown else f"<{len(value.data)} bytes>"
    if isinstance(value, FailureDetails):
        return f"{value.type}: {value.message}"
    if isinstance(value, RuntimeStatus):
        return value.value
    if isinstance(value, bytes):
        return value.hex()[:16] or "nothing"
    return repr(value)


def _fields(view: InstanceRow | InstanceStatus) -> dict[str, object]:
    return {
        "status": view.status,
        "generation": view.generation,
        "name": view.name,
        "version": view.version,
        "output": view.output,
        "failure": view.failure,
        "custom_status": view.custom_status,
    }


def _fold_fields(fold: InstanceFold) -> dict[str, object]:
    status = fold.status
    if status is RuntimeStatus.CONTINUED_AS_NEW:
        # its next generation begins in the instance's next turn: it runs on meanwhile
        status = RuntimeStatus.RUNNING
    return {
        "status": status,
        "generation": fold.generation,
        "name": fold.name,
        "version": fold.version,
        "output": fold.output,
        "failure": fold.failure,
        "custom_status": fold.custom_status,
    }


def _diff_fields(
    instance_id: str, source: str, want: Mapping[str, object], have: Mapping[str, object]
) -> list[Difference]:
    return [
        Difference(instance_id, source, name, _text(want[name]), _text(have[name]))
        for name in want
        if want[name] != have[name]
    ]


def _not_started(fold: InstanceFold | None, status: RuntimeStatus | None, generation: int) -> bool:
    """A run that never started: its row has no history of its own yet."""
    if status not in _NOT_STARTED:
        return False
    return fold is None or generation > fold.generation


def _compare_rows(
    instance_id: str, fold: InstanceFold, rows: Mapping[int, bytes]
) -> list[Difference]:
    if dict(rows) == fold.rows:
        return []
    for seq in sorted(set(rows) | set(fold.rows)):
        want, have = fold.rows.get(seq), rows.get(seq)
        if want != have:
            return [Difference(instance_id, "rows", f"#{seq}", _text(want), _text(have))]
    return []  # pragma: no cover - the dicts differ, so some sequence differs


def _compare_state(
    instance_id: str, fold: InstanceFold, meta: InstanceRow | None, rows: Mapping[int, bytes]
) -> list[Difference]:
    if meta is None or meta.status is None:
        return [Difference(instance_id, "state", "row", _text(fold.status) + " instance", "no row")]
    diffs = []
    if not _not_started(fold, meta.reported_status, meta.generation):
        diffs += _diff_fields(instance_id, "state", _fold_fields(fold), _fields(meta))
    tail = {"next_sequence": fold.next_sequence, "last_hash": fold.last_hash}
    diffs += _diff_fields(
        instance_id,
        "state",
        tail,
        {"next_sequence": meta.next_sequence, "last_hash": meta.last_hash},
    )
    return diffs + _compare_rows(instance_id, fold, rows)


def _compare_status(
    instance_id: str, fold: InstanceFold, status: InstanceStatus | None
) -> list[Difference]:
    if status is None:
        return [
            Difference(instance_id, "status", "record", _text(fold.status) + " instance", "none")
        ]
    if _not_started(fold, status.status, status.generation):
        return []
    if status.status is RuntimeStatus.PARKED and fold.status in _LIVE:
        # the record shows the parking and its error; the history, the run it stands in
        status = replace(status, status=fold.status, failure=fold.failure)
    return _diff_fields(instance_id, "status", _fold_fields(fold), _fields(status))


def _without_history(
    instance_id: str, meta: InstanceRow | None, status: InstanceStatus | None
) -> list[Difference]:
    """A row or status record with no history at all must be a run that never started
    (or a schedule's row, which has a status record and never a history)."""
    if instance_id.startswith(SCHEDULE_PREFIX):
        return []
    diffs = []
    if meta is not None and not _not_started(None, meta.reported_status, meta.generation):
        diffs.append(Difference(instance_id, "state", "row", "no events", _text(meta.status)))
    if status is not None and not _not_started(None, status.status, status.generation):
        diffs.append(Difference(instance_id, "status", "record", "no events", _text(status.status)))
    return diffs


def _is_purged(
    fold: InstanceFold,
    tables: ProcessorTables | None,
    meta: InstanceRow | None,
    status: InstanceStatus | None,
    instance_id: str,
) -> bool:
    if fold.status is None or not fold.status.is_terminal or status is not None:
        return False
    return tables is None or (meta is None and instance_id not in tables.rows)


def compare(
    folds: Mapping[str, InstanceFold],
    tables: ProcessorTables | None,
    statuses: Mapping[str, InstanceStatus] | None,
) -> AuditReport:
    """Every difference between the history's implied state and the engine's state.

    ``tables`` or ``statuses`` may be None to leave that side out of the comparison.
    """
    metas: Mapping[str, InstanceRow] = {} if tables is None else tables.metas
    known = set(folds) | set(metas) | set(statuses or {})
    report = AuditReport(len(known), sum(f.events for f in folds.values()))
    for instance_id in sorted(known):
        meta = metas.get(instance_id)
        if meta is not None and meta.status is None:
            meta = None  # only events raised before a start: not an instance yet
        status = None if statuses is None else statuses.get(instance_id)
        fold = folds.get(instance_id)
        if fold is None:
            diffs = _without_history(instance_id, meta, status)
            if not diffs and (meta is not None or status is not None):
                report.not_started.append(instance_id)
        elif _is_purged(fold, tables, meta, status, instance_id):
            report.purged.append(instance_id)
            continue
        else:
            diffs = []
            if tables is not None:
                diffs += _compare_state(instance_id, fold, meta, tables.rows.get(instance_id, {}))
            if statuses is not None:
                diffs += _compare_status(instance_id, fold, status)
        report.differences.extend(diffs)
    if tables is not None:
        report.differences.extend(
            Difference(i, "state", "row", "a readable row", f"undecodable ({why})")
            for i, why in sorted(tables.undecodable.items())
        )
    return report


def confirmed(first: AuditReport, second: AuditReport) -> AuditReport:
    """``second`` keeping only differences ``first`` saw too (same instance, source, field).

    On a running engine, an instance can change between reading the history and reading the
    state; a difference that persists across two reads is real, one that vanished was not.
    """
    seen = {(d.instance_id, d.source, d.field) for d in first.differences}
    kept = [d for d in second.differences if (d.instance_id, d.source, d.field) in seen]
    return AuditReport(second.instances, second.events, kept, second.purged, second.not_started)
