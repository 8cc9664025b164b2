"""Mapping a business record to the command its trigger asks for (pure).

A trigger's record is not on the engine's partitioning (its producer chose the key and the
partition), so it is not applied where it is read: each record becomes one ``StartWorkflow``
or ``RaiseEvent`` command on the commands topic, keyed by the instance id it names, written
in the transaction that commits the record's offset (``engine/adapters/kafka/triggers.py``).
The command's request id names the record (topic, partition, offset), so the processor's
de-duplication would also recognise it. A record that cannot be mapped (no key, a missing
header or field, a value that is not JSON or not Avro of the schema) goes to dead letters
with the reason, as a :class:`Unmapped`.

A record can also fail its whole batch on every try: its command is refused by the
producer or the broker (larger than the commands topic takes, an invalid record), or
mapping it raises. :class:`Quarantine` finds that record and, after
:data:`REFUSALS_BEFORE_DEAD_LETTER` failures in a row, sends it to dead letters instead,
so the topic goes on (:func:`given_up`); failures that are not about one record (the
broker is away, the producer was fenced) are retried for ever, as before.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from engine.codec import decode_user_avro, encode_message, instance_key
from engine.config.triggers import RAISE, IdSource, Trigger
from engine.core.errors import CodecError, TriggerError
from engine.core.messages import Message, RaiseEvent, StartWorkflow
from engine.core.payloads import JSON, Payload, to_payload
from engine.runtime.registry import Registry
from engine.services.dead_letters import Headers, dead_letter_of
from engine.services.processor.poison import fit_dead_letter
from engine.services.records import RawRecord


class Unmapped(Exception):
    """The record names no instance or its value cannot be read; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One record the bridge produces for an input record."""

    topic: str
    key: bytes
    value: bytes
    headers: Headers = ()


#: Failures in a row, each caused by the same record, before the record goes to dead letters.
REFUSALS_BEFORE_DEAD_LETTER = 3

Place = tuple[str, int, int]
"""Where a business record was read: topic, partition, offset."""


def place_of(record: RawRecord) -> Place:
    return (record.topic, record.partition, record.offset)


class Quarantine:
    """Finds the record that keeps the bridge's batch from committing, and gives up on it.

    A batch fails as a whole, and a refusal does not always name its record: the broker
    refuses a whole record batch (small records sent with a too large one are refused with
    it), and several records may map to the same instance (the same key). So after a
    refusal the bridge *isolates*: it handles the next ``isolate_for`` records one per
    transaction, where a refusal names its record for sure (a record whose mapping raised
    is named at once). The record refused ``limit`` times in a row (its :meth:`verdict` is
    then the reason) goes to dead letters; once it is committed there, whole batches resume.
    """

    def __init__(self, limit: int = REFUSALS_BEFORE_DEAD_LETTER, isolate_for: int = 500) -> None:
        self.limit = max(1, limit)
        self.isolate_for = isolate_for
        #: Records still to handle one per transaction (0: whole batches).
        self.isolating = 0
        self._suspect: Place | None = None
        self._strikes = 0
        self._reason = ""

    def batch_refused(self) -> None:
        """A refusal that names no single record: isolate the records that follow."""
        self.isolating = self.isolate_for

    def record_refused(self, place: Place, reason: str) -> int:
        """The record at ``place`` failed its batch; returns its failures in a row."""
        if place == self._suspect:
            self._strikes += 1
        else:
            self._suspect, self._strikes = place, 1
        self._reason = reason
        self.isolating = max(self.isolating, 1)
        return self._strikes

    def verdict(self, place: Place) -> str | None:
        """Why the record at ``place`` goes to dead letters, or None while it may still pass."""
        if place == self._suspect and self._strikes >= self.limit:
            return f"it failed its batch {self._strikes} times in a row: {self._reason}"
        return None

    def committed(self, places: list[Place]) -> None:
        """These records were committed (as commands or dead letters)."""
        if self._suspect in places:
            dead = self._strikes >= self.limit
            self._suspect, self._strikes, self._reason = None, 0, ""
            if dead:
                self.isolating = 0
                return
        self.isolating = max(0, self.isolating - len(places))


def given_up(
    trigger: Trigger,
    record: RawRecord,
    dead_letters: str,
    reason: str,
    max_record_bytes: int = 1_000_000,
) -> Outgoing:
    """The dead letter of a record the bridge gave up on (``reason``: its verdict)."""
    return _dead_letter(trigger, record, dead_letters, reason, max_record_bytes)


def check_workflows(triggers: Iterable[Trigger], registry: Registry) -> None:
    """Raise :class:`TriggerError` when a trigger names a workflow ``registry`` lacks:
    its every record would start nothing, so the process stops before it runs."""
    for trigger in triggers:
        if not registry.has_workflow(trigger.workflow, trigger.version):
            raise TriggerError(
                f"trigger for topic {trigger.topic!r} names workflow {trigger.workflow!r}"
                f"{f' version {trigger.version!r}' if trigger.version else ''}, which is not "
                f"registered; check the name or pass the module that defines it"
            )


def request_id(record: RawRecord) -> str:
    """The command's request id: the record's place, unique per business record."""
    return f"trigger:{record.topic}:{record.partition}:{record.offset}"


def command_for(trigger: Trigger, record: RawRecord) -> Message:
    """The command the record asks for; raises :class:`Unmapped` with the reason."""
    value = _decoded(trigger, record)
    instance_id = _instance_id(trigger, record, value)
    payload = _input(value)
    if trigger.action == RAISE:
        return RaiseEvent(
            instance_id=instance_id,
            name=trigger.event_name,
            input=payload,
            request_id=request_id(record),
        )
    return StartWorkflow(
        instance_id=instance_id,
        name=trigger.workflow,
        version=trigger.version,
        input=payload,
        reuse_policy=trigger.id_reuse_policy,
        request_id=request_id(record),
    )


def route(
    trigger: Trigger,
    record: RawRecord,
    commands: str,
    dead_letters: str,
    max_record_bytes: int = 1_000_000,
) -> Outgoing:
    """The command record for ``record``, or its dead letter when it cannot be mapped or
    its command would be larger than one record may be (the producer would refuse it on
    every try, and the topic would stall)."""
    try:
        command = command_for(trigger, record)
        value = encode_message(command)
        if len(value) > max_record_bytes:
            raise Unmapped(
                f"its command would be {len(value)} bytes, over max_record_bytes "
                f"({max_record_bytes}); send smaller values, or raise the setting"
            )
    except Unmapped as exc:
        return _dead_letter(trigger, record, dead_letters, exc.reason, max_record_bytes)
    return Outgoing(commands, instance_key(command.instance_id), value)


def _dead_letter(
    trigger: Trigger, record: RawRecord, dead_letters: str, why: str, max_record_bytes: int
) -> Outgoing:
    reason = f"trigger {trigger.describe()}: {why}"
    cut, reason = fit_dead_letter(record.value, reason, max_record_bytes)
    letter, headers = dead_letter_of(replace(record, value=cut), record.topic, reason)
    return Outgoing(dead_letters, record.key or b"", letter, headers)


_NO_VALUE = object()


def _decoded(trigger: Trigger, record: RawRecord) -> Any:
    """The value as Python data (None for a tombstone)."""
    if record.value is None:
        return None
    if trigger.format == "avro":
        try:
            return decode_user_avro(trigger.schema, record.value)
        except CodecError as exc:
            raise Unmapped(str(exc)) from exc
    try:
        return json.loads(record.value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Unmapped(f"the value is not JSON: {exc}") from exc


def _instance_id(trigger: Trigger, record: RawRecord, value: Any) -> str:
    source, name = trigger.id_source
    if source is IdSource.KEY:
        return _text(record.key, "the record has no key (the trigger takes the id from it)")
    if source is IdSource.HEADER:
        found = [v for h, v in record.headers if h == name]
        return _text(found[0] if found else None, f"the record has no header {name!r}")
    return _field(value, name)


def _text(raw: bytes | None, missing: str) -> str:
    if not raw:
        raise Unmapped(missing)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unmapped("the instance id is not UTF-8 text") from None


def _field(value: Any, path: str) -> str:
    node = value
    for part in path.split("."):
        node = node.get(part, _NO_VALUE) if isinstance(node, dict) else _NO_VALUE
        if node is _NO_VALUE:
            raise Unmapped(f"the value has no field {path!r} (the trigger takes the id from it)")
    if isinstance(node, bool) or not isinstance(node, str | int) or node == "":
        raise Unmapped(f"field {path!r} must be a non-empty string or a number, got {node!r}")
    return str(node)


def _input(value: Any) -> Payload | None:
    if value is None:
        return None
    try:
        return to_payload(value, JSON)
    except CodecError as exc:
        raise Unmapped(f"the value cannot be a workflow input: {exc}") from exc
