"""The Confluent wire format: reframing, decoding by schema id, the registry client and its
start-up errors, and the settings that turn it on.

The registry is the REST API faked at the HTTP layer (tests/schema_registry_fake.py says
why no real one runs here); every call below is real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from schema_registry_fake import fake_schema_registry

from engine.adapters.schema_registry import (
    SchemaRegistryClient,
    connect_schema_registry,
    subject_of,
)
from engine.codec import (
    current_schema,
    decode_history,
    decode_message,
    encode_history,
    encode_message,
    seal_history,
    verify_history_chain,
)
from engine.codec.confluent import (
    confluent_header,
    forget_schema_ids,
    learn_schema_id,
    to_confluent,
    to_single_object,
    use_schema_resolver,
)
from engine.config.settings import load_settings
from engine.config.topics import topic_names
from engine.core.errors import (
    ConfigurationError,
    MalformedRecordError,
    SchemaRegistryError,
    UnknownSchemaError,
)
from engine.core.history import ExecutionStarted, HistoryEvent, RuntimeStatus
from engine.core.messages import InstanceStatus, StartWorkflow
from engine.core.payloads import Payload


@pytest.fixture(autouse=True)
def _no_learnt_ids() -> Iterator[None]:
    forget_schema_ids()
    yield
    forget_schema_ids()


def _status(instance_id: str = "order-1") -> InstanceStatus:
    return InstanceStatus(
        instance_id, name="orders.place", status=RuntimeStatus.RUNNING, created_ms=1_700_000_000_000
    )


def _schema_text(name: str) -> str:
    return json.dumps(current_schema(name).raw)


def _history(instance_id: str, sequence: int, previous: bytes) -> tuple[HistoryEvent, bytes]:
    body = ExecutionStarted("orders.place", Payload(b"{}"))
    event = HistoryEvent(instance_id, sequence, 1_700_000_000_000 + sequence, 0, body, b"", b"")
    return seal_history(event, previous)


@given(schema_id=st.integers(0, 2**31 - 1), body=st.binary(max_size=64))
def test_reframing_keeps_the_avro_body_and_swaps_only_the_header(schema_id: int, body: bytes):
    single = b"\xc3\x01" + bytes(range(8)) + body
    framed = to_confluent(single, schema_id)
    assert framed[:1] == b"\x00"
    assert int.from_bytes(framed[1:5], "big") == schema_id
    assert framed[5:] == body
    learn_schema_id(schema_id, _schema_text("InstanceStatus"))
    assert to_single_object(framed)[10:] == body


def test_a_registry_framed_status_decodes_once_its_id_is_learnt():
    learn_schema_id(42, _schema_text("InstanceStatus"))
    framed = to_confluent(encode_message(_status()), 42)
    assert decode_message(framed) == _status()


def test_a_registry_frame_without_a_registry_names_the_setting_that_is_missing():
    framed = to_confluent(encode_message(_status()), 77)
    with pytest.raises(MalformedRecordError, match="needs schema_registry_url"):
        decode_message(framed)


def test_an_id_no_registry_knows_is_an_unknown_schema():
    learn_schema_id(42, _schema_text("InstanceStatus"))
    framed = to_confluent(encode_message(_status()), 77)
    with pytest.raises(UnknownSchemaError, match="schema id 77"):
        decode_message(framed)


def test_an_id_of_a_schema_the_engine_does_not_know_is_an_unknown_schema():
    foreign = {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "int"}]}
    learn_schema_id(5, json.dumps(foreign))
    with pytest.raises(UnknownSchemaError, match="unknown writer schema fingerprint"):
        decode_message(confluent_header(5) + b"\x02")


def test_a_truncated_registry_frame_is_refused_with_the_reason():
    learn_schema_id(42, _schema_text("InstanceStatus"))
    with pytest.raises(UnknownSchemaError, match="too short"):
        decode_message(b"\x00\x01")
    with pytest.raises(MalformedRecordError, match="magic byte 00"):
        decode_message(b"\x07garbage-record")


def test_the_resolver_is_asked_once_per_unknown_id():
    asked: list[int] = []

    def resolve(schema_id: int) -> str:
        asked.append(schema_id)
        return _schema_text("InstanceStatus")

    use_schema_resolver(resolve)
    framed = to_confluent(encode_message(_status()), 9)
    assert decode_message(framed) == _status()
    assert decode_message(framed) == _status()
    assert asked == [9]


def test_the_history_hash_chain_holds_over_registry_framed_records():
    learn_schema_id(3, _schema_text("HistoryEvent"))
    first, first_bytes = _history("order-9", 1, b"")
    second, second_bytes = _history("order-9", 2, first.hash)
    framed = [to_confluent(first_bytes, 3), to_confluent(second_bytes, 3)]
    assert verify_history_chain(framed) == second.hash
    assert decode_history(framed[1]) == second
    assert encode_history(second) == second_bytes


# --- the registry client over HTTP ------------------------------------------------------------


def test_start_up_registers_the_three_topics_under_topic_name_subjects():
    with fake_schema_registry() as (url, registry):
        settings = load_settings(
            env={}, namespace="sr-unit", schema_registry_url=url, wire_format="confluent"
        )
        wire = connect_schema_registry(settings)
        names = topic_names("sr-unit")
        assert sorted(registry.subjects) == sorted(
            subject_of(t) for t in (names.history, names.status, names.command_outcomes)
        )
        assert set(wire.schema_ids) == {names.history, names.status, names.command_outcomes}
        status_id = wire.schema_ids[names.status]
        assert registry.subjects[subject_of(names.status)] == [status_id]
        framed = wire.frame(names.status, encode_message(_status()))
        assert framed is not None and framed[:5] == confluent_header(status_id)
        assert decode_message(framed) == _status()
        # other topics stay single-object
        assert wire.frame(names.commands, b"\xc3\x01rest") == b"\xc3\x01rest"


def test_single_object_with_a_registry_registers_nothing_but_resolves_ids():
    with fake_schema_registry() as (url, registry):
        command_id = SchemaRegistryClient(url).register("x.commands-value", _schema_text("Command"))
        settings = load_settings(env={}, namespace="sr-unit-2", schema_registry_url=url)
        assert connect_schema_registry(settings).schema_ids == {}
        assert registry.subjects == {"x.commands-value": [command_id]}
        start = StartWorkflow("order-2", name="orders.place", request_id="r-1")
        framed = to_confluent(encode_message(start), command_id)
        assert decode_message(framed) == start  # the id is looked up in the registry
        assert ("GET", f"/schemas/ids/{command_id}") in registry.requests


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_registry_that_does_not_answer_stops_the_start_with_the_address():
    url = f"http://127.0.0.1:{_free_port()}"
    settings = load_settings(
        env={}, namespace="sr-down", schema_registry_url=url, wire_format="confluent"
    )
    with pytest.raises(SchemaRegistryError, match="does not answer") as caught:
        connect_schema_registry(settings)
    assert url in str(caught.value)
    assert "schema_registry_url" in str(caught.value)


def test_a_refused_schema_stops_the_start_with_the_registry_s_reason():
    with fake_schema_registry() as (url, registry):
        registry.refused_subjects.add(subject_of(topic_names("sr-refused").history))
        settings = load_settings(
            env={}, namespace="sr-refused", schema_registry_url=url, wire_format="confluent"
        )
        with pytest.raises(SchemaRegistryError, match=r"HTTP 409.*incompatible.*compatibility"):
            connect_schema_registry(settings)


def test_an_address_that_is_no_registry_is_named_so():
    with (
        fake_schema_registry() as (url, _registry),
        pytest.raises(SchemaRegistryError, match="HTTP 404"),
    ):
        SchemaRegistryClient(url + "/not-a-registry").subjects()


# --- settings ---------------------------------------------------------------------------------


def test_confluent_without_a_registry_url_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="needs a Schema Registry"):
        load_settings(env={}, wire_format="confluent")


def test_wire_format_and_url_are_checked():
    with pytest.raises(ConfigurationError, match="must be one of single-object, confluent"):
        load_settings(env={}, wire_format="json")
    with pytest.raises(ConfigurationError, match="http:// or https://"):
        load_settings(env={}, schema_registry_url="127.0.0.1:8081")
    settings = load_settings(
        env={"TURNSTILE_SCHEMA_REGISTRY_URL": "http://127.0.0.1:8081"}, wire_format="confluent"
    )
    assert settings.schema_registry_url == "http://127.0.0.1:8081"
