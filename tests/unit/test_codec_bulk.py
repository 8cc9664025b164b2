"""The bulk history decoder (``decode_histories``): for any rows it gives exactly what one
``decode_history`` per row gives, values, types and errors alike, and the objects it
builds are as frozen and hashable as the constructors' own."""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import codec
from engine.codec.registry import MARKER, released_versions, schema_dir, strip_logical_types
from engine.core.errors import CodecError, MalformedRecordError, UnknownSchemaError
from engine.core.history import EVENT_TYPES, HistoryEvent, TaskCompleted, TurnStarted
from engine.core.payloads import Payload
from tests.unit.test_codec import history_events

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ANY_EVENT = st.one_of([history_events(t) for t in EVENT_TYPES])


def _singly(rows: list[Any]) -> list[HistoryEvent]:
    return [codec.decode_history(row) for row in rows]


def _same(bulk: list[HistoryEvent], single: list[HistoryEvent]) -> None:
    assert bulk == single
    for a, b in zip(bulk, single, strict=True):
        assert type(a.body) is type(b.body)
        for f in dataclasses.fields(a.body):
            assert type(getattr(a.body, f.name)) is type(getattr(b.body, f.name))


@PROPERTY
@given(events=st.lists(ANY_EVENT, max_size=12))
def test_bulk_decode_equals_single_decodes(events: list[HistoryEvent]) -> None:
    rows = [codec.encode_history(e) for e in events]
    bulk = codec.decode_histories(rows)
    _same(bulk, _singly(rows))
    assert bulk == events


@PROPERTY
@given(events=st.lists(ANY_EVENT, min_size=1, max_size=6), cut=st.data())
def test_bulk_decode_fails_like_single_decodes(events: list[HistoryEvent], cut: Any) -> None:
    """A damaged row anywhere raises the error one decode of that row raises."""
    rows = [codec.encode_history(e) for e in events]
    index = cut.draw(st.integers(0, len(rows) - 1))
    row = rows[index]
    damage = cut.draw(
        st.sampled_from(["truncate", "trailing", "flip"]) if len(row) > 11 else st.just("trailing")
    )
    if damage == "truncate":
        rows[index] = row[: cut.draw(st.integers(10, len(row) - 1))]
    elif damage == "trailing":
        rows[index] = row + b"\x00"
    else:
        at = cut.draw(st.integers(10, len(row) - 1))
        rows[index] = row[:at] + bytes([row[at] ^ 0xFF]) + row[at + 1 :]
    try:
        expected: list[HistoryEvent] | Exception = _singly(rows)
    except CodecError as exc:
        expected = exc
    if isinstance(expected, Exception):
        with pytest.raises(type(expected)) as raised:
            codec.decode_histories(rows)
        assert str(raised.value) == str(expected)
    else:  # the flipped byte still spelled a valid record
        _same(codec.decode_histories(rows), expected)


def test_bulk_decode_takes_older_schemas_bytes_likes_and_sealed_rows() -> None:
    """Rows of a released schema and non-bytes rows take the single decoder's path."""
    old = json.loads(
        (schema_dir() / "released" / released_versions()[0] / "HistoryEvent.avsc").read_text()
    )
    datum = {
        "instance_id": "a",
        "sequence": 1,
        "timestamp_ms": 5,
        "generation": 0,
        "body": ("io.turnstile.history.TaskCompleted", {"task_id": 9, "output": None}),
        "previous_hash": b"",
        "hash": b"",
    }
    out = io.BytesIO()
    out.write(MARKER + codec.schema_fingerprint(old))
    fastavro.schemaless_writer(out, fastavro.parse_schema(strip_logical_types(old)), datum)
    first = HistoryEvent("a", 0, 4, 0, TurnStarted(4))
    sealed, first_row = codec.seal_history(first, b"")
    rows: list[Any] = [first_row, out.getvalue(), bytearray(first_row), memoryview(first_row)]
    bulk = codec.decode_histories(rows)
    _same(bulk, _singly(rows))
    assert bulk[0] == sealed
    assert type(bulk[2].hash) is bytes and bulk[2] == sealed
    assert bulk[1].body == TaskCompleted(9, None, attempt=1)


def test_bulk_decode_explains_foreign_records() -> None:
    with pytest.raises(UnknownSchemaError):
        codec.decode_histories(
            [
                codec.encode_history(HistoryEvent("a", 0, 0, 0, TurnStarted(0))),
                b"\xc3\x01" + b"\x00" * 8 + b"\x02",
            ]
        )
    with pytest.raises(MalformedRecordError):
        codec.decode_histories([b"nonsense"])
    with pytest.raises(CodecError, match="tombstone"):
        codec.decode_histories([None])  # type: ignore[list-item]
    assert codec.decode_histories([]) == []


def test_decoded_objects_stay_frozen_and_hash_like_constructed_ones() -> None:
    event = HistoryEvent("i", 3, 7, 0, TaskCompleted(1, Payload(b"1"), 2), b"p", b"h")
    for decoded in (
        codec.decode_histories([codec.encode_history(event)])[0],
        codec.decode_history(codec.encode_history(event)),
    ):
        assert type(decoded) is HistoryEvent and type(decoded.body) is TaskCompleted
        assert hash(decoded) == hash(event) and decoded == event
        assert dataclasses.replace(decoded, sequence=4).sequence == 4
        for obj, name in (
            (decoded, "sequence"),
            (decoded.body, "task_id"),
            (decoded.body.output, "data"),
        ):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(obj, name, 0)
