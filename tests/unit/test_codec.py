"""The wire codec: round trips for every record type, agreement with fastavro, golden bytes,
old schema versions, error reporting and the history hash chain."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import typing
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from types import NoneType, UnionType
from typing import Any

import fastavro
import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import codec
from engine.codec.bindings import MESSAGE_RECORD_TYPES, from_avro, to_avro
from engine.codec.registry import (
    MARKER,
    load_current,
    released_versions,
    schema_dir,
    strip_logical_types,
)
from engine.core.errors import (
    CodecError,
    HistoryIntegrityError,
    MalformedRecordError,
    UnknownSchemaError,
)
from engine.core.failure import FailureDetails
from engine.core.history import (
    EVENT_TYPES,
    EventBody,
    ExecutionStarted,
    HistoryEvent,
    RuntimeStatus,
    TaskCompleted,
    TaskScheduled,
    TurnStarted,
)
from engine.core.messages import (
    COMMAND_BODY_TYPES,
    ActivityTask,
    IdReusePolicy,
    InstanceStatus,
    Message,
    StartWorkflow,
)
from engine.core.payloads import Payload

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "records.json"
UPDATE_GOLDEN = "TURNSTILE_UPDATE_GOLDEN"
MESSAGE_TYPES: tuple[type[Message], ...] = (*COMMAND_BODY_TYPES, *MESSAGE_RECORD_TYPES)
CURRENT = load_current()


# --- strategies built from the dataclasses ------------------------------------------------


def _avro_int_kinds() -> dict[tuple[str, str], str]:
    """(record short name, field) -> "int" or "long", so integers stay in Avro's range."""
    kinds: dict[tuple[str, str], str] = {}
    for schema in CURRENT.values():
        for name, named in schema.parsed["__named_schemas"].items():
            for f in named.get("fields", ()):
                branches = f["type"] if isinstance(f["type"], list) else [f["type"]]
                for branch in branches:
                    if branch in ("int", "long"):
                        kinds[(name.rsplit(".", 1)[-1], f["name"])] = branch
    return kinds


INT_KINDS = _avro_int_kinds()
TEXT = st.text(max_size=12)


def _payloads() -> st.SearchStrategy[Payload]:
    return st.builds(Payload, st.binary(max_size=40), st.sampled_from(["json", "binary", "é"]))


FAILURES: st.SearchStrategy[FailureDetails] = st.deferred(
    lambda: st.builds(
        FailureDetails,
        TEXT,
        TEXT,
        TEXT,
        st.booleans(),
        st.none() | FAILURES,
    )
)


def _for_hint(owner: type, name: str, hint: Any) -> st.SearchStrategy[Any]:
    if isinstance(hint, UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not NoneType]
        return st.none() | _for_hint(owner, name, args[0])
    if typing.get_origin(hint) is dict:
        return st.dictionaries(TEXT, TEXT, max_size=3)
    if typing.get_origin(hint) is list and typing.get_args(hint) == (bytes,):
        return st.lists(st.binary(max_size=20), max_size=3)
    if typing.get_origin(hint) is list:  # a list of records (UpdatesCarried.updates)
        return st.lists(instances(typing.get_args(hint)[0]), max_size=3)
    if hint is int:
        bits = 31 if INT_KINDS.get((owner.__name__, name), "long") == "int" else 63
        return st.integers(-(2**bits), 2**bits - 1) | st.integers(-70, 70)
    simple: dict[Any, st.SearchStrategy[Any]] = {
        str: TEXT,
        bool: st.booleans(),
        bytes: st.binary(max_size=40),
        Payload: _payloads(),
        FailureDetails: FAILURES,
    }
    if hint in simple:
        return simple[hint]
    if isinstance(hint, type) and issubclass(hint, Enum):
        return st.sampled_from(list(hint))
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return instances(hint)  # a nested record (a schedule's spec)
    raise TypeError(f"no strategy for {owner.__name__}.{name}: {hint!r}")


def instances(cls: type) -> st.SearchStrategy[Any]:
    """Any value of a core dataclass, every field drawn from its declared type."""
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _for_hint(cls, f.name, hints[f.name]) for f in dataclasses.fields(cls)}
    return st.builds(cls, **kwargs)


def history_events(body_type: type[EventBody]) -> st.SearchStrategy[HistoryEvent]:
    return st.builds(
        HistoryEvent,
        instance_id=TEXT,
        sequence=st.integers(0, 2**63 - 1),
        timestamp_ms=st.integers(0, 2**45),
        generation=st.integers(0, 2**31 - 1),
        body=instances(body_type),
        previous_hash=st.binary(max_size=32),
        hash=st.binary(max_size=32),
    )


def _reference_encode(obj: Any, name: str) -> bytes:
    schema = CURRENT[name]
    out = io.BytesIO()
    out.write(schema.header)
    fastavro.schemaless_writer(
        out, schema.parsed, to_avro(obj, schema.parsed, schema.parsed["__named_schemas"])
    )
    return out.getvalue()


def _reference_decode(data: bytes, name: str) -> Any:
    schema = CURRENT[name]
    stream = io.BytesIO(data[10:])
    datum = fastavro.schemaless_reader(
        stream,
        schema.parsed,
        None,
        return_record_name=True,
        return_record_name_override=True,
    )
    return from_avro(datum, schema.parsed, schema.parsed["__named_schemas"])


def _schema_name(msg: Message) -> str:
    return "Command" if type(msg) in COMMAND_BODY_TYPES else type(msg).__name__


# --- round trips --------------------------------------------------------------------------

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("body_type", EVENT_TYPES, ids=lambda t: t.__name__)
@PROPERTY
@given(data=st.data())
def test_history_round_trip_matches_fastavro(body_type: type[EventBody], data: Any) -> None:
    event = data.draw(history_events(body_type))
    encoded = codec.encode_history(event)
    assert encoded == _reference_encode(event, "HistoryEvent")
    assert codec.decode_history(encoded) == event
    assert _reference_decode(encoded, "HistoryEvent") == event


@pytest.mark.parametrize("body_type", EVENT_TYPES, ids=lambda t: t.__name__)
@PROPERTY
@given(data=st.data(), previous=st.one_of(st.just(b""), st.binary(min_size=1, max_size=200)))
def test_sealing_matches_its_definition(
    body_type: type[EventBody], data: Any, previous: bytes
) -> None:
    """Sealing is: encode the event with ``previous_hash`` set and an empty hash, drop the
    empty hash's length byte, SHA-256 the rest - whatever hashes the event came with, and
    for previous hashes of any length (one- and two-byte Avro lengths)."""
    event = data.draw(history_events(body_type))
    unsealed = dataclasses.replace(event, previous_hash=previous, hash=b"")
    prefix = _reference_encode(unsealed, "HistoryEvent")[:-1]
    digest = hashlib.sha256(prefix).digest()
    sealed, encoded = codec.seal_history(event, previous)
    assert encoded == prefix + b"\x40" + digest
    assert sealed == dataclasses.replace(event, previous_hash=previous, hash=digest)
    assert codec.decode_history(encoded) == sealed


@pytest.mark.parametrize("msg_type", MESSAGE_TYPES, ids=lambda t: t.__name__)
@PROPERTY
@given(data=st.data())
def test_message_round_trip_matches_fastavro(msg_type: type[Message], data: Any) -> None:
    msg = data.draw(instances(msg_type))
    encoded = codec.encode_message(msg)
    assert encoded == _reference_encode(msg, _schema_name(msg))
    decoded = codec.decode_message(encoded)
    assert type(decoded) is msg_type
    assert decoded == msg
    assert _reference_decode(encoded, _schema_name(msg)) == msg


def test_every_event_type_has_a_branch_in_order() -> None:
    body = next(f for f in CURRENT["HistoryEvent"].raw["fields"] if f["name"] == "body")
    assert [b["name"] for b in body["type"]] == [t.KIND for t in EVENT_TYPES]
    fields = [f["name"] for f in CURRENT["HistoryEvent"].raw["fields"]]
    assert fields[-2:] == ["previous_hash", "hash"]


def test_every_message_type_has_a_schema() -> None:
    body = next(f for f in CURRENT["Command"].raw["fields"] if f["name"] == "body")
    assert [b["name"] for b in body["type"]] == [t.KIND for t in COMMAND_BODY_TYPES]
    for msg_type in MESSAGE_RECORD_TYPES:
        assert CURRENT[msg_type.__name__].raw["name"] == msg_type.KIND


def test_header_is_single_object_encoding_of_the_writer_schema() -> None:
    raw = json.loads((schema_dir() / "Command.avsc").read_text())
    canonical = to_parsing_canonical_form(fastavro.parse_schema(raw))
    expected = bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
    data = codec.encode_message(StartWorkflow("order-1", "checkout"))
    assert data[:2] == MARKER == b"\xc3\x01"
    assert data[2:10] == expected


def test_fingerprint_byte_order_follows_the_avro_spec() -> None:
    # The spec's CRC-64-AVRO of the schema "null" is 0x63dd24e7cc258f8a; the single-object
    # header carries it little-endian.
    assert codec.schema_fingerprint("null") == (0x63DD24E7CC258F8A).to_bytes(8, "little")


def test_container_file_round_trip() -> None:
    events = [
        HistoryEvent("a", 0, 1_700_000_000_000, 0, ExecutionStarted("wf", tags={"k": "v"})),
        HistoryEvent("a", 1, 1_700_000_000_001, 0, TaskCompleted(0, Payload(b"1"))),
    ]
    buffer = io.BytesIO()
    assert codec.write_history_file(buffer, events) == 2
    buffer.seek(0)
    assert list(codec.read_history_file(buffer)) == events
    schema = codec.history_schema()
    timestamp = next(f for f in schema["fields"] if f["name"] == "timestamp_ms")
    assert timestamp["type"]["logicalType"] == "timestamp-millis"


def test_instance_key_is_utf8() -> None:
    assert codec.instance_key("commande-é") == "commande-é".encode()


# --- golden bytes -------------------------------------------------------------------------

FAILURE = FailureDetails(
    "ValueError", "bad input", "Traceback...", False, FailureDetails("KeyError", "'x'")
)
PAYLOAD = Payload(b'{"amount":42}')


def golden_samples() -> dict[str, Any]:
    """One record of each type with every field set away from its default."""
    bodies: dict[type[EventBody], EventBody] = {t: _sample(t) for t in EVENT_TYPES}
    samples: dict[str, Any] = {
        f"HistoryEvent/{t.__name__}": HistoryEvent(
            "order-1", 7, 1_732_900_000_000, 1, body, b"\x01" * 32, b"\x02" * 32
        )
        for t, body in bodies.items()
    }
    samples.update({t.__name__: _sample(t) for t in MESSAGE_TYPES})
    return samples


def _sample(cls: type) -> Any:
    values: dict[type, Any] = {
        str: "x-é",
        int: 300,
        bool: True,
        bytes: b"\x00\xff",
        Payload: PAYLOAD,
        FailureDetails: FAILURE,
        list[bytes]: [b"\x00\xff"],
    }
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = [a for a in typing.get_args(hint) if a is not NoneType]
        base = args[0] if isinstance(hint, UnionType) else hint
        if typing.get_origin(base) is dict:
            kwargs[f.name] = {"team": "payments"}
        elif isinstance(base, type) and issubclass(base, Enum):
            kwargs[f.name] = list(base)[-1]
        elif base not in values and dataclasses.is_dataclass(base):
            kwargs[f.name] = _sample(base)  # a nested record (a schedule's spec)
        elif typing.get_origin(base) is list and dataclasses.is_dataclass(typing.get_args(base)[0]):
            kwargs[f.name] = [_sample(typing.get_args(base)[0])]  # records (carried updates)
        else:
            kwargs[f.name] = values[base]
    return cls(**kwargs)


def _encode_any(obj: Any) -> bytes:
    return codec.encode_history(obj) if isinstance(obj, HistoryEvent) else codec.encode_message(obj)


def test_golden_bytes() -> None:
    """Encoded bytes and fingerprints are frozen: a change here breaks every reader.

    After a deliberate, compatible schema change (see schemas/README.md), regenerate with
    TURNSTILE_UPDATE_GOLDEN=1 and release the schemas as a new version.
    """
    samples = golden_samples()
    current = {
        "fingerprints": {name: s.fingerprint.hex() for name, s in sorted(CURRENT.items())},
        "records": {name: _encode_any(obj).hex() for name, obj in samples.items()},
    }
    if os.environ.get(UPDATE_GOLDEN):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert current["fingerprints"] == golden["fingerprints"]
    assert set(golden["records"]) == set(samples)
    for name, obj in samples.items():
        data = bytes.fromhex(golden["records"][name])
        assert current["records"][name] == golden["records"][name], name
        decoded = (
            codec.decode_history(data) if name.startswith("History") else codec.decode_message(data)
        )
        assert decoded == obj, name


# --- older schema versions ----------------------------------------------------------------


def _drop_field(schema: dict[str, Any], record: str, field: str) -> None:
    """Remove a field from a named record anywhere in a schema JSON (in place)."""

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("name") == record and node.get("type") == "record":
                node["fields"] = [f for f in node["fields"] if f["name"] != field]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)


@pytest.fixture
def older_release(tmp_path: Path) -> Iterator[dict[str, dict[str, Any]]]:
    """A schema folder with a release "0" that lacks fields added later."""
    shutil.copytree(schema_dir(), tmp_path, dirs_exist_ok=True)
    old: dict[str, dict[str, Any]] = {}
    for name, record, field in [
        ("HistoryEvent", "TaskCompleted", "attempt"),
        ("HistoryEvent", "ExecutionStarted", "tags"),
        ("Command", "StartWorkflow", "tags"),
        ("Command", "StartWorkflow", "scheduled_start_ms"),
        ("ActivityTask", "ActivityTask", "scheduled_ms"),
    ]:
        schema = old.setdefault(name, json.loads((schema_dir() / f"{name}.avsc").read_text()))
        _drop_field(schema, record, field)
    release = tmp_path / "released" / "0"
    release.mkdir(parents=True)
    for name, schema in old.items():
        (release / f"{name}.avsc").write_text(json.dumps(schema))
    codec.reload_schemas(tmp_path)
    try:
        yield old
    finally:
        codec.reload_schemas()


def _write_old(schema: dict[str, Any], datum: Any) -> bytes:
    parsed = fastavro.parse_schema(strip_logical_types(schema))
    out = io.BytesIO()
    out.write(MARKER + codec.schema_fingerprint(schema))
    fastavro.schemaless_writer(out, parsed, datum)
    return out.getvalue()


def test_old_history_records_decode_with_defaults(older_release: dict[str, Any]) -> None:
    datum = {
        "instance_id": "a",
        "sequence": 3,
        "timestamp_ms": 5,
        "generation": 0,
        "body": ("io.turnstile.history.TaskCompleted", {"task_id": 9, "output": None}),
        "previous_hash": b"",
        "hash": b"",
    }
    event = codec.decode_history(_write_old(older_release["HistoryEvent"], datum))
    assert event == HistoryEvent("a", 3, 5, 0, TaskCompleted(9, None, attempt=1))
    # every earlier release is known; the latest is the current set itself
    earlier = {"current", "0", *released_versions()[:-1]}
    assert earlier <= {s.version for s in codec.known_schemas()}


def test_old_commands_decode_with_defaults(older_release: dict[str, Any]) -> None:
    body = {
        "name": "wf",
        "input": {"data": b"1", "encoding": "json"},
        "version": "",
        "reuse_policy": "IGNORE_IF_RUNNING",
        "request_id": "r",
        "parent_instance_id": None,
        "parent_generation": None,
        "parent_task_id": None,
    }
    datum = {"instance_id": "i", "body": ("io.turnstile.command.StartWorkflow", body)}
    msg = codec.decode_message(_write_old(older_release["Command"], datum))
    assert msg == StartWorkflow("i", "wf", Payload(b"1"), "", IdReusePolicy.IGNORE_IF_RUNNING, "r")


def test_old_records_hash_check_on_raw_bytes(older_release: dict[str, Any]) -> None:
    datum = {
        "instance_id": "a",
        "sequence": 0,
        "timestamp_ms": 5,
        "generation": 0,
        "body": ("io.turnstile.history.TurnStarted", {"time_ms": 5}),
        "previous_hash": b"",
        "hash": b"",
    }
    unsealed = _write_old(older_release["HistoryEvent"], datum)
    prefix = unsealed[:-1]

    sealed = prefix + b"\x40" + hashlib.sha256(prefix).digest()
    assert codec.history_hash_ok(sealed)
    assert codec.decode_history(sealed).hash == hashlib.sha256(prefix).digest()


# --- errors -------------------------------------------------------------------------------

EVENT = HistoryEvent("order-1", 0, 1_732_900_000_000, 0, TaskScheduled(0, "charge", PAYLOAD))


@pytest.mark.parametrize(
    ("data", "error", "needle"),
    [
        (b"", MalformedRecordError, "marker c3 01"),
        (b"\x00\x01" + b"\x00" * 20, MalformedRecordError, "00 01 00"),
        (b"\xc3\x01" + b"\xab" * 8 + b"x", UnknownSchemaError, "abababababababab"),
    ],
)
def test_bad_headers_are_named(data: bytes, error: type[Exception], needle: str) -> None:
    with pytest.raises(error, match=needle):
        codec.decode_history(data)
    with pytest.raises(error, match=needle):
        codec.decode_message(data)


def _corruptions() -> list[tuple[str, Callable[[bytes], bytes]]]:
    """(expected message, corruption of an encoded EVENT)."""
    header = codec.encode_history(EVENT)[:10]
    return [
        ("truncated", lambda d: d[:-5]),
        ("1 trailing bytes", lambda d: d + b"\x00"),
        ("union index byte 0x7e", lambda d: header + b"\x02a\x00\x00\x00\x7e" + d[25:]),
        ("UnicodeDecodeError", lambda d: header + b"\x04\xff\xfe" + d[18:]),
        ("negative length -2", lambda d: header + b"\x03" + d[11:]),
        ("longer than 10 bytes", lambda d: header + b"\x02a" + b"\xff" * 10 + b"\x01"),
        ("enum index", lambda d: _with_bad_enum()),
    ]


def _with_bad_enum() -> bytes:
    data = codec.encode_message(InstanceStatus("i", status=RuntimeStatus.FAILED))
    index = data.index(bytes([2 * list(RuntimeStatus).index(RuntimeStatus.FAILED)]), 12)
    return data[:index] + b"\x40" + data[index + 1 :]


@pytest.mark.parametrize(("needle", "corrupt"), _corruptions(), ids=[c[0] for c in _corruptions()])
def test_malformed_records_raise(needle: str, corrupt: Callable[[bytes], bytes]) -> None:
    data = corrupt(codec.encode_history(EVENT))
    decode = codec.decode_message if needle == "enum index" else codec.decode_history
    with pytest.raises(MalformedRecordError) as info:
        decode(data)
    message = str(info.value)
    assert needle in message
    assert "fingerprint" in message and data[2:10].hex() in message
    assert data[:4].hex(" ") in message


def test_message_and_history_are_not_confused() -> None:
    with pytest.raises(UnknownSchemaError, match="wrong topic"):
        codec.decode_message(codec.encode_history(EVENT))
    with pytest.raises(UnknownSchemaError, match="wrong topic"):
        codec.decode_history(codec.encode_message(StartWorkflow("x")))


def test_encode_errors_name_the_field() -> None:
    with pytest.raises(CodecError, match="sequence"):
        codec.encode_history(dataclasses.replace(EVENT, sequence="seven"))  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="generation"):
        codec.encode_history(dataclasses.replace(EVENT, generation=2**40))
    with pytest.raises(CodecError, match="cannot encode a str"):
        codec.encode_message("not a message")  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        codec.encode_message(InstanceStatus("i", status="RUNNING?"))  # type: ignore[arg-type]


def test_plain_strings_encode_as_enum_symbols() -> None:
    msg = ActivityTask("i", name="charge")
    assert codec.decode_message(codec.encode_message(msg)) == msg
    status = InstanceStatus("i", status="RUNNING")  # type: ignore[arg-type]
    decoded = codec.decode_message(codec.encode_message(status))
    assert isinstance(decoded, InstanceStatus) and decoded.status is RuntimeStatus.RUNNING


# --- the hash chain -----------------------------------------------------------------------


def _chain(count: int) -> list[bytes]:
    out, previous = [], b""
    for seq in range(count):
        sealed, data = codec.seal_history(
            HistoryEvent("order-1", seq, 1_732_900_000_000 + seq, 0, TurnStarted(seq)), previous
        )
        assert sealed.previous_hash == previous and len(sealed.hash) == codec.HASH_SIZE
        assert codec.decode_history(data) == sealed
        previous = sealed.hash
        out.append(data)
    return out


def test_sealed_events_verify() -> None:
    sealed, data = codec.seal_history(EVENT, b"\x07" * 32)
    assert codec.history_hash_ok(data)
    assert codec.previous_hash_of(data) == b"\x07" * 32
    assert codec.hash_of(data) == sealed.hash
    assert codec.encode_history(sealed) == data
    assert not codec.history_hash_ok(codec.encode_history(EVENT))  # never sealed


def test_any_flipped_byte_is_detected() -> None:
    _, data = codec.seal_history(EVENT, b"\x07" * 32)
    for index in range(len(data)):
        tampered = bytearray(data)
        tampered[index] ^= 0x01
        assert not codec.history_hash_ok(bytes(tampered)), index


def test_chain_verification() -> None:
    records = _chain(4)
    assert codec.verify_history_chain(records) == codec.hash_of(records[-1])
    for broken in (records[:1] + records[2:], [records[1], records[0], *records[2:]]):
        with pytest.raises(HistoryIntegrityError, match="#"):
            codec.verify_history_chain(broken)
    resealed, data = codec.seal_history(
        dataclasses.replace(codec.decode_history(records[2]), body=TurnStarted(99)),
        codec.hash_of(records[1]),
    )
    with pytest.raises(HistoryIntegrityError, match="#3"):
        codec.verify_history_chain([*records[:2], data, records[3]])
    assert resealed.hash != codec.hash_of(records[2])


def test_decode_accepts_buffers_and_explains_none() -> None:
    data = codec.encode_history(EVENT)
    assert codec.decode_history(bytearray(data)) == EVENT  # type: ignore[arg-type]
    assert codec.decode_history(memoryview(data)) == EVENT  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="tombstone"):
        codec.decode_message(None)  # type: ignore[arg-type]
