"""Triggers: configuration is checked before anything runs, and each business record maps
to one command or to a dead letter with the reason (never to nothing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.codec import decode_message, encode_user_avro
from engine.config.settings import load_settings
from engine.config.triggers import Trigger, parse_trigger_flag, parse_triggers
from engine.core.errors import ConfigurationError, TriggerError
from engine.core.messages import DeadLetter, IdReusePolicy, RaiseEvent, StartWorkflow
from engine.core.payloads import from_payload
from engine.services.records import RawRecord
from engine.services.triggers import Quarantine, Unmapped, command_for, given_up, route

ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "string"}, {"name": "total", "type": "long"}],
}


def rec(value: Any, key: bytes | None = b"o-1", headers: tuple[Any, ...] = ()) -> RawRecord:
    data = json.dumps(value).encode() if isinstance(value, dict) else value
    return RawRecord(2, 41, key, data, 0, "orders", headers)


def test_the_flag_form() -> None:
    assert parse_trigger_flag("orders:ship") == Trigger("orders", "ship")
    assert parse_trigger_flag("payments:ship:raise").action == "raise"
    for bad in ("orders", "orders:", "a:b:c:d", "orders:ship:stop"):
        with pytest.raises(TriggerError):
            parse_trigger_flag(bad)


def test_tables_are_checked_with_suggestions(tmp_path: Path) -> None:
    with pytest.raises(TriggerError, match="did you mean workflow"):
        parse_triggers([{"topic": "t", "workflw": "w"}])
    with pytest.raises(TriggerError, match="needs workflow"):
        parse_triggers([{"topic": "t"}])
    with pytest.raises(TriggerError, match="id_reuse_policy"):
        parse_triggers([{"topic": "t", "workflow": "w", "id_reuse_policy": "sometimes"}])
    with pytest.raises(TriggerError, match="header:NAME"):
        parse_triggers([{"topic": "t", "workflow": "w", "id": "header"}])
    with pytest.raises(TriggerError, match="more than one trigger"):
        parse_triggers(["t:a", "t:b"])
    with pytest.raises(TriggerError, match="needs schema"):
        parse_triggers([{"topic": "t", "workflow": "w", "format": "avro"}])
    schema = tmp_path / "order.avsc"
    schema.write_text(json.dumps(ORDER))
    [t] = parse_triggers([{"topic": "t", "workflow": "w", "format": "avro", "schema": str(schema)}])
    assert json.loads(t.schema) == ORDER


def test_the_config_file_holds_publish_topics_and_triggers(tmp_path: Path) -> None:
    config = tmp_path / "turnstile.toml"
    config.write_text(
        '[turnstile]\nnamespace = "shop"\n\n[publish]\ntopics = ["shipments"]\n\n'
        '[[triggers]]\ntopic = "orders"\nworkflow = "ship"\nid = "field:order.id"\n'
        'id_reuse_policy = "reject_duplicate"\n'
    )
    settings = load_settings(config, env={})
    assert settings.publish_topics == ("shipments",)
    [trigger] = settings.triggers
    assert trigger.id_source[1] == "order.id"
    assert trigger.id_reuse_policy is IdReusePolicy.REJECT_DUPLICATE
    env = {"TURNSTILE_PUBLISH_TOPICS": "a,b", "TURNSTILE_TRIGGERS": "x:wf,y:wf:raise"}
    from_env = load_settings(env=env)
    assert from_env.publish_topics == ("a", "b")
    assert [t.action for t in from_env.triggers] == ["start", "raise"]
    config.write_text('[publish]\ntopic = ["typo"]\n')
    with pytest.raises(ConfigurationError, match=r"\[publish\] takes one key"):
        load_settings(config, env={})


def test_a_record_starts_the_workflow_with_its_value_and_a_request_id_of_its_place() -> None:
    trigger = Trigger(
        "orders", "ship", version="2", id_reuse_policy=IdReusePolicy.IGNORE_IF_RUNNING
    )
    command = command_for(trigger, rec({"total": 3}))
    assert isinstance(command, StartWorkflow)
    assert (command.instance_id, command.name, command.version) == ("o-1", "ship", "2")
    assert command.reuse_policy is IdReusePolicy.IGNORE_IF_RUNNING
    assert from_payload(command.input) == {"total": 3}
    assert command.request_id == "trigger:orders:2:41"


def test_raise_takes_the_id_from_a_header_or_a_field() -> None:
    by_header = Trigger("payments", "ship", action="raise", event="paid", id="header:order")
    command = command_for(by_header, rec({"eur": 1}, headers=(("order", b"o-7"),)))
    assert isinstance(command, RaiseEvent)
    assert (command.instance_id, command.name) == ("o-7", "paid")
    by_field = Trigger("payments", "ship", action="raise", id="field:order.id")
    command = command_for(by_field, rec({"order": {"id": 12}}))
    assert (command.instance_id, command.name) == ("12", "payments")  # event name: the topic


def test_avro_values_are_read_with_the_trigger_schema() -> None:
    [trigger] = parse_triggers(
        [
            {
                "topic": "orders",
                "workflow": "ship",
                "format": "avro",
                "schema": json.dumps(ORDER),
                "id": "field:id",
            }
        ]
    )
    command = command_for(trigger, rec(encode_user_avro(trigger.schema, {"id": "a-1", "total": 5})))
    assert command.instance_id == "a-1"
    assert from_payload(command.input) == {"id": "a-1", "total": 5}  # type: ignore[attr-defined]
    with pytest.raises(Unmapped, match="not Avro"):
        command_for(trigger, rec(b"\x02"))


@pytest.mark.parametrize(
    ("trigger", "record", "reason"),
    [
        (Trigger("orders", "ship"), rec({"a": 1}, key=None), "has no key"),
        (Trigger("orders", "ship"), rec({"a": 1}, key=b"\xff"), "not UTF-8"),
        (Trigger("orders", "ship"), rec(b"{oops"), "not JSON"),
        (Trigger("orders", "ship", id="header:h"), rec({"a": 1}), "no header 'h'"),
        (Trigger("orders", "ship", id="field:a.b"), rec({"a": 1}), "no field 'a.b'"),
        (Trigger("orders", "ship", id="field:a"), rec({"a": [1]}), "non-empty string"),
    ],
)
def test_records_that_cannot_be_mapped_go_to_dead_letters_with_the_reason(
    trigger: Trigger, record: RawRecord, reason: str
) -> None:
    out = route(trigger, record, "ns.commands", "ns.dead-letters")
    assert out.topic == "ns.dead-letters"
    letter = decode_message(out.value)
    assert isinstance(letter, DeadLetter)
    assert reason in letter.reason and letter.source_topic == "orders"
    assert (letter.source_partition, letter.source_offset) == (2, 41)
    assert dict(out.headers)["reason"].decode() == letter.reason


@given(st.binary(max_size=40), st.one_of(st.none(), st.binary(max_size=8)))
def test_any_record_maps_to_a_command_or_a_dead_letter(value: bytes, key: bytes | None) -> None:
    for trigger in (Trigger("orders", "ship"), Trigger("orders", "ship", id="field:id")):
        out = route(trigger, RawRecord(0, 0, key, value, 0, "orders"), "c", "d")
        assert out.topic in ("c", "d")
        assert isinstance(decode_message(out.value), StartWorkflow | DeadLetter)


def test_a_record_too_large_for_a_command_goes_to_dead_letters_cut() -> None:
    out = route(Trigger("orders", "ship"), rec({"blob": "x" * 5000}), "c", "d", 2000)
    letter = decode_message(out.value)
    assert out.topic == "d" and isinstance(letter, DeadLetter)
    assert "over max_record_bytes" in letter.reason and len(letter.value or b"") <= 1000


def test_flags_add_to_the_config_and_a_trigger_must_name_a_registered_workflow() -> None:
    from engine import Registry
    from engine.cli.integration import check_integration_topics, with_integration_flags
    from engine.config.settings import Settings

    base = Settings(triggers=(Trigger("orders", "ship"),), publish_topics=("a",))
    settings = with_integration_flags(base, ["payments:ship:raise"], ["b", "a"])
    assert [t.topic for t in settings.triggers] == ["orders", "payments"]
    assert settings.publish_topics == ("a", "b")
    with pytest.raises(TriggerError, match="config file and a --trigger flag"):
        with_integration_flags(base, ["orders:other"], [])
    with pytest.raises(TriggerError, match="'ship', which is not registered"):
        check_integration_topics(settings, Registry())


def test_a_refused_batch_is_isolated_and_its_record_given_up_after_the_limit() -> None:
    q = Quarantine(limit=3, isolate_for=10)
    bad, good = ("orders", 0, 5), ("orders", 0, 4)
    q.batch_refused()  # a batch of many records: which one is not known
    assert q.isolating == 10
    q.committed([good])  # one record per transaction now; the one before it passes
    assert q.isolating == 9 and q.verdict(good) is None
    for strikes in (1, 2, 3):
        assert q.verdict(bad) is None  # still tried as a command
        assert q.record_refused(bad, "MSG_SIZE_TOO_LARGE") == strikes
    reason = q.verdict(bad)
    assert reason is not None and "3 times in a row" in reason and "MSG_SIZE_TOO_LARGE" in reason
    assert q.verdict(good) is None
    q.committed([bad])  # its dead letter is committed: whole batches again
    assert q.isolating == 0 and q.verdict(bad) is None


def test_only_failures_in_a_row_of_one_record_count() -> None:
    q = Quarantine(limit=2)
    q.record_refused(("t", 0, 1), "x")
    q.record_refused(("t", 0, 2), "y")  # another record: it starts its own count
    assert q.verdict(("t", 0, 1)) is None and q.verdict(("t", 0, 2)) is None
    q.committed([("t", 0, 2)])  # it passed after all (the cause went away)
    q.record_refused(("t", 0, 2), "y")
    assert q.verdict(("t", 0, 2)) is None


def test_a_given_up_record_is_a_dead_letter_with_the_reason_and_its_value() -> None:
    out = given_up(Trigger("orders", "ship"), rec({"id": 1}), "d", "it failed 3 times")
    letter = decode_message(out.value)
    assert out.topic == "d" and isinstance(letter, DeadLetter)
    assert "it failed 3 times" in letter.reason and letter.source_offset == 41
    assert json.loads(letter.value or b"") == {"id": 1}


def test_only_refusals_about_one_record_are_held_against_it() -> None:
    from confluent_kafka import KafkaError

    from engine.adapters.kafka.triggers import is_record_refusal

    assert is_record_refusal(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    for outage in (
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._MSG_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,  # every record would be refused: not one's
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    ):
        assert not is_record_refusal(KafkaError(outage)), outage
    assert not is_record_refusal(None)
