"""The schema evolution rules (schemas/README.md) hold for every released version, and the
checker really catches the changes the rules forbid."""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Callable
from typing import Any

import fastavro
import pytest

from engine.codec.evolution import (
    Violation,
    check_all,
    check_current,
    check_evolution,
    check_resolution,
    check_shared_types,
    sample_records,
)
from engine.codec.registry import (
    ALL_SCHEMAS,
    load_current,
    load_released,
    released_versions,
    schema_dir,
)
from engine.codec.wire import current_schema

Schema = dict[str, Any]
CURRENT = {name: s.raw for name, s in load_current().items()}


def test_current_schemas_follow_every_rule_against_every_release() -> None:
    violations = check_all()
    assert not violations, "\n".join(str(v) for v in violations)


def test_the_current_set_is_released() -> None:
    """Every current schema is part of a release, so the next change is checked against it."""
    assert released_versions(), "release the schemas: copy schemas/*.avsc to schemas/released/1/"
    latest = released_versions()[-1]
    released = {s.name: s for s in load_released() if s.version == latest}
    assert set(released) == set(ALL_SCHEMAS)


def test_released_schemas_are_never_edited() -> None:
    """A released file is a record of what producers used; changing it breaks decoding."""
    versions = {s.version: s for s in load_released() if s.name == "Command"}
    assert "1" in versions
    assert versions["1"].fingerprint.hex() == "ce760bcd5cd43d10"


def test_command_schema_is_self_contained() -> None:
    """Java, Go and kcat producers must be able to use Command.avsc on its own."""
    import fastavro

    raw = json.loads((schema_dir() / "Command.avsc").read_text())
    fastavro.parse_schema(raw, named_schemas={})  # no external named types needed


def test_samples_cover_every_union_branch() -> None:
    samples = sample_records(CURRENT["HistoryEvent"], 100)
    seen = {s["body"][0] for s in samples}
    assert len(seen) == len(CURRENT["HistoryEvent"]["fields"][4]["type"])


# --- mutations the checker must catch -----------------------------------------------------


def _record(schema: Schema, name: str) -> Schema:
    """The definition of a named record anywhere inside a schema JSON."""
    found: list[Schema] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "record" and node.get("name") == name:
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    assert found, name
    return found[0]


def _field(schema: Schema, record: str, field: str) -> Schema:
    return next(f for f in _record(schema, record)["fields"] if f["name"] == field)


def _body(schema: Schema) -> list[Any]:
    body: list[Any] = next(f for f in schema["fields"] if f["name"] == "body")["type"]
    return body


def _retype(s: Schema) -> None:
    _field(s, "TaskCompleted", "task_id")["type"] = "string"


def _insert_branch(s: Schema) -> None:
    _body(s).insert(3, {"type": "record", "name": "Paused", "fields": []})


def _remove_branch(s: Schema) -> None:
    del _body(s)[5]


def _swap_branches(s: Schema) -> None:
    body = _body(s)
    body[3], body[4] = body[4], body[3]


def _field_without_default(s: Schema) -> None:
    _record(s, "TimerFired")["fields"].append({"name": "late_ms", "type": "long"})


def _remove_field(s: Schema) -> None:
    record = _record(s, "TaskScheduled")
    record["fields"] = [f for f in record["fields"] if f["name"] != "timeout_ms"]


def _rename_field(s: Schema) -> None:
    _field(s, "TaskScheduled", "timeout_ms")["name"] = "timeout_millis"


def _rename_record(s: Schema) -> None:
    _record(s, "TimerFired")["name"] = "TimerElapsed"


def _enum_without_default(s: Schema) -> None:
    status = _field(s, "ExecutionCompleted", "status")["type"]
    del status["default"]


def _enum_symbol_in_middle(s: Schema) -> None:
    status = _field(s, "ExecutionCompleted", "status")["type"]
    status["symbols"].insert(1, "PAUSED")


def _hash_not_last(s: Schema) -> None:
    s["fields"].append({"name": "note", "type": "string", "default": ""})


MUTATIONS: dict[str, tuple[Callable[[Schema], None], str]] = {
    "retype a field": (_retype, "retyped"),
    "insert a union branch in the middle": (_insert_branch, "union-branches"),
    "remove a union branch": (_remove_branch, "union-branches"),
    "reorder union branches": (_swap_branches, "union-branches"),
    "add a field without default": (_field_without_default, "field-without-default"),
    "remove a field": (_remove_field, "field-removed"),
    "rename a field without alias": (_rename_field, "field-removed"),
    "rename a record without alias": (_rename_record, "renamed"),
    "enum without default": (_enum_without_default, "enum-default"),
    "enum symbol inserted in the middle": (_enum_symbol_in_middle, "enum-symbols"),
    "hash not the last field": (_hash_not_last, "hash-last"),
}


@pytest.mark.parametrize("label", list(MUTATIONS))
def test_incompatible_changes_are_flagged(label: str) -> None:
    mutate, rule = MUTATIONS[label]
    new = copy.deepcopy(CURRENT["HistoryEvent"])
    mutate(new)
    violations = check_evolution(CURRENT["HistoryEvent"], new, "HistoryEvent")
    assert rule in {v.rule for v in violations}, violations


def test_retyping_also_fails_resolution() -> None:
    new = copy.deepcopy(CURRENT["HistoryEvent"])
    _retype(new)
    assert [v.rule for v in check_resolution(CURRENT["HistoryEvent"], new)] == ["resolution"]


def _add_field_with_default(s: Schema) -> None:
    _record(s, "TimerFired")["fields"].append({"name": "late_ms", "type": "long", "default": 0})


def _append_branch(s: Schema) -> None:
    _body(s).append({"type": "record", "name": "Paused", "fields": []})


def _rename_with_alias(s: Schema) -> None:
    field = _field(s, "TaskScheduled", "timeout_ms")
    field["name"], field["aliases"] = "timeout_millis", ["timeout_ms"]
    record = _record(s, "TimerFired")
    record["name"], record["aliases"] = "TimerElapsed", ["TimerFired"]


def _append_enum_symbol(s: Schema) -> None:
    _field(s, "ExecutionCompleted", "status")["type"]["symbols"].append("PAUSED")


def _new_field_before_hash(s: Schema) -> None:
    s["fields"].insert(-1, {"name": "note", "type": "string", "default": ""})


@pytest.mark.parametrize(
    "mutate",
    [
        _add_field_with_default,
        _append_branch,
        _rename_with_alias,
        _append_enum_symbol,
        _new_field_before_hash,
    ],
)
def test_compatible_changes_pass(mutate: Callable[[Schema], None]) -> None:
    new = copy.deepcopy(CURRENT["HistoryEvent"])
    mutate(new)
    violations = check_evolution(CURRENT["HistoryEvent"], new) + check_resolution(
        CURRENT["HistoryEvent"], new
    )
    assert not violations, violations


def test_shared_types_must_agree() -> None:
    schemas = list(load_current().values())
    assert not check_shared_types(schemas)
    changed = copy.deepcopy(CURRENT["ChildResult"])
    _record(changed, "Payload")["fields"].append(
        {"name": "schema_id", "type": "string", "default": ""}
    )
    from engine.codec.registry import WriterSchema, parse_record, schema_fingerprint

    odd = WriterSchema(
        "ChildResult", "x", changed, parse_record(changed), schema_fingerprint(changed)
    )
    rules = {v.rule for v in check_shared_types([*schemas, odd])}
    assert rules == {"shared-type"}


def test_every_current_enum_has_a_default() -> None:
    for name, raw in CURRENT.items():
        assert not check_current(raw, name), name


def test_violations_read_well() -> None:
    text = str(Violation("HistoryEvent", "io.turnstile.HistoryEvent.x", "retyped", "changed"))
    assert text == "HistoryEvent: io.turnstile.HistoryEvent.x: [retyped] changed"


def test_the_command_union_is_defined_once() -> None:
    """InstanceRow.avsc names io.turnstile.Command; the engine reads Command.avsc in there,
    so the row's schema (and its fingerprint) holds exactly the file's definition."""
    row = json.loads((schema_dir() / "InstanceRow.avsc").read_text())
    assert row["fields"][1]["type"] == ["null", "io.turnstile.Command"]
    assert '"name": "Command"' not in json.dumps(row)
    command = json.loads((schema_dir() / "Command.avsc").read_text())
    assert current_schema("InstanceRow").raw["fields"][1]["type"][1] == command


def test_a_schedule_row_written_with_last_slot_ms_reads_it_as_last_fire_ms() -> None:
    """The field was renamed with an alias: a row of release 4 keeps its value."""
    old = next(s for s in load_released() if s.name == "InstanceRow" and s.version == "4")
    new = current_schema("InstanceRow")
    rows = [r for r in sample_records(old.raw, 40, seed=3) if r.get("schedule") is not None]
    assert rows, "the sampler covers the schedule branch"
    row = rows[0]
    branch = row["schedule"]  # the sampler names union branches: (type name, value)
    schedule = branch[1] if isinstance(branch, tuple) else branch
    schedule["last_slot_ms"] = 1_234_567
    out = io.BytesIO()
    fastavro.schemaless_writer(out, old.parsed, row)
    out.seek(0)
    read = fastavro.schemaless_reader(out, old.parsed, new.parsed)
    assert isinstance(read, dict) and read["schedule"]["last_fire_ms"] == 1_234_567
