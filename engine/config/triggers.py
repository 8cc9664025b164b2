"""Triggers: business topics whose records start workflows or raise events on them.

A trigger names the topic, the workflow (and version), what a record does (``start`` a run
or ``raise`` an event on one), where the instance id comes from (the record key, a header,
or a field of the JSON or Avro value) and the ID-reuse policy of its starts. They come from
``--trigger TOPIC:WORKFLOW[:ACTION]`` flags or ``[[triggers]]`` tables of the config file,
and are checked here, before a processor connects, so a typo stops the process with the
reason. Pure: no I/O beyond reading an Avro schema file a trigger names.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from engine.core.errors import TriggerError
from engine.core.messages import IdReusePolicy

START = "start"
RAISE = "raise"


class IdSource(StrEnum):
    """Where a trigger finds the instance id in a record."""

    KEY = "key"
    HEADER = "header"
    FIELD = "field"


@dataclass(frozen=True, slots=True)
class Trigger:
    """One business topic mapped to a workflow."""

    topic: str
    workflow: str
    version: str = ""
    #: ``start`` a run per record, or ``raise`` the event ``event`` on the instance.
    action: str = START
    #: The event name of ``raise`` (default: the topic name).
    event: str = ""
    #: ``key``, ``header:NAME`` or ``field:PATH`` (a dotted path into the value).
    id: str = "key"
    id_reuse_policy: IdReusePolicy = IdReusePolicy.ERROR_IF_RUNNING
    #: How the record value is read: ``json`` or ``avro`` (with ``schema``).
    format: str = "json"
    #: The Avro schema of the values: JSON text, or the path of a ``.avsc`` file.
    schema: str = ""

    @property
    def id_source(self) -> tuple[IdSource, str]:
        """(source, header name or field path)."""
        source, _, name = self.id.partition(":")
        return IdSource(source), name

    @property
    def event_name(self) -> str:
        return self.event or self.topic

    def describe(self) -> str:
        what = f"raise {self.event_name!r} on" if self.action == RAISE else "start"
        return f"{self.topic} -> {what} {self.workflow} (id from {self.id})"


def parse_trigger_flag(text: str) -> Trigger:
    """``TOPIC:WORKFLOW[:ACTION]`` (ACTION ``start``, the default, or ``raise``)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
        raise TriggerError(
            f"--trigger {text!r} must be TOPIC:WORKFLOW or TOPIC:WORKFLOW:ACTION (ACTION "
            f"start or raise); use a [[triggers]] table for the other options"
        )
    action = parts[2].strip() if len(parts) == 3 else START
    return checked(Trigger(topic=parts[0].strip(), workflow=parts[1].strip(), action=action))


_TABLE_KEYS = {f.name for f in fields(Trigger)}


def trigger_from_table(table: Mapping[str, Any]) -> Trigger:
    """One ``[[triggers]]`` table."""
    unknown = sorted(set(table) - _TABLE_KEYS)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(_TABLE_KEYS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise TriggerError(
            f"[[triggers]] has unknown key(s) {', '.join(unknown)}{hint}; known keys are "
            f"{', '.join(sorted(_TABLE_KEYS))}"
        )
    for required in ("topic", "workflow"):
        if not str(table.get(required, "")).strip():
            raise TriggerError(f'[[triggers]] needs {required} = "..." ({dict(table)!r})')
    values = {k: str(v) for k, v in table.items() if k != "id_reuse_policy"}
    policy = _policy(str(table.get("id_reuse_policy", IdReusePolicy.ERROR_IF_RUNNING.value)))
    return checked(Trigger(**values, id_reuse_policy=policy))


def parse_triggers(raw: Any) -> tuple[Trigger, ...]:
    """Triggers from a setting: flag strings (a comma-separated string, or a list of them),
    tables, or Trigger objects."""
    if isinstance(raw, str):
        raw = [p for p in raw.split(",") if p.strip()]
    if not isinstance(raw, Sequence):
        raise TriggerError("triggers must be a list of [[triggers]] tables or TOPIC:WORKFLOW")
    out: list[Trigger] = []
    for item in raw:
        if isinstance(item, Trigger):
            out.append(checked(item))
        elif isinstance(item, str):
            out.append(parse_trigger_flag(item))
        elif isinstance(item, Mapping):
            out.append(trigger_from_table(item))
        else:
            raise TriggerError(f"a trigger must be a table or TOPIC:WORKFLOW, got {item!r}")
    topics = [t.topic for t in out]
    doubled = sorted({t for t in topics if topics.count(t) > 1})
    if doubled:
        raise TriggerError(
            f"topic(s) {', '.join(doubled)} have more than one trigger; give each business "
            f"topic one trigger"
        )
    return tuple(out)


def _policy(text: str) -> IdReusePolicy:
    try:
        return IdReusePolicy(text.strip().upper())
    except ValueError:
        names = ", ".join(p.value for p in IdReusePolicy)
        raise TriggerError(f"trigger id_reuse_policy {text!r} is not one of {names}") from None


def checked(trigger: Trigger) -> Trigger:
    """The trigger, if every value is valid (an Avro schema file is read into ``schema``)."""
    where = f"trigger for topic {trigger.topic!r}"
    if trigger.action not in (START, RAISE):
        raise TriggerError(f"{where}: action {trigger.action!r} must be start or raise")
    source, name = trigger.id.partition(":")[0], trigger.id.partition(":")[2]
    if source not in {s.value for s in IdSource} or (source != "key") != bool(name.strip()):
        raise TriggerError(
            f"{where}: id {trigger.id!r} must be key, header:NAME or field:PATH (a dotted "
            f"path into the JSON or Avro value, e.g. field:order.id)"
        )
    if trigger.format not in ("json", "avro"):
        raise TriggerError(f"{where}: format {trigger.format!r} must be json or avro")
    if trigger.format == "avro":
        return _with_schema(trigger, where)
    if trigger.schema:
        raise TriggerError(f'{where}: schema is only read with format = "avro"')
    return trigger


def _with_schema(trigger: Trigger, where: str) -> Trigger:
    text = trigger.schema.strip()
    if not text:
        raise TriggerError(f"{where}: format avro needs schema = a .avsc path or the JSON")
    if not text.startswith(("{", "[", '"')):
        try:
            text = Path(text).read_text()
        except OSError as exc:
            raise TriggerError(f"{where}: cannot read the Avro schema file: {exc}") from exc
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise TriggerError(f"{where}: the Avro schema is not valid JSON: {exc}") from exc
    compact = json.dumps(parsed, separators=(",", ":"), sort_keys=True)
    return Trigger(
        **{f.name: getattr(trigger, f.name) for f in fields(Trigger) if f.name != "schema"},
        schema=compact,
    )
