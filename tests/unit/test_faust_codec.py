"""The faust codecs: engine records in and out exactly as the engine's own codec writes
them, anything else refused with the reason (no broker needed; the broker test is
tests/integration/test_faust_kafka.py)."""

from __future__ import annotations

import pytest

from engine.codec import encode_history, encode_message
from engine.core.errors import CodecError, MalformedRecordError
from engine.core.history import ExecutionStarted, HistoryEvent, RuntimeStatus
from engine.core.messages import InstanceStatus, RaiseEvent, StartWorkflow
from engine.core.payloads import Payload

pytest.importorskip(
    "faust", reason="faust-streaming is not installed: pip install 'turnstile-engine[faust]'"
)
from faust.serializers import codecs

from engine.interop.faust import HISTORY_CODEC, MESSAGE_CODEC, register_codecs

MESSAGES = [
    StartWorkflow("order-1", name="orders.place", input=Payload(b"{}"), request_id="r1"),
    RaiseEvent("order-1", name="paid", input=Payload(b"3"), request_id="r2"),
    InstanceStatus("order-1", name="orders.place", status=RuntimeStatus.RUNNING),
]


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    register_codecs()


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_messages_go_out_as_the_engine_writes_them_and_come_back(message: object) -> None:
    data = codecs.dumps(MESSAGE_CODEC, message)
    assert data == encode_message(message)  # type: ignore[arg-type]
    assert codecs.loads(MESSAGE_CODEC, data) == message


def test_history_events_decode_with_the_history_codec() -> None:
    event = HistoryEvent("order-1", 0, 1_700_000_000_000, 0, ExecutionStarted("orders.place"))
    data = encode_history(event)
    assert codecs.loads(HISTORY_CODEC, data) == event
    assert codecs.dumps(HISTORY_CODEC, event) == data


def test_what_is_not_an_engine_record_is_refused_with_the_reason() -> None:
    with pytest.raises(CodecError, match="writes engine messages"):
        codecs.dumps(MESSAGE_CODEC, {"instance_id": "x"})
    with pytest.raises(CodecError, match="history is the processor's to write"):
        codecs.dumps(HISTORY_CODEC, MESSAGES[0])
    with pytest.raises(MalformedRecordError, match="marker c3 01"):
        codecs.loads(MESSAGE_CODEC, b'{"id": 1}')


def test_with_a_registry_connected_the_codec_reads_the_registry_s_format() -> None:
    from schema_registry_fake import fake_schema_registry

    from engine.adapters.schema_registry import connect_schema_registry
    from engine.codec.confluent import forget_schema_ids
    from engine.config.settings import load_settings
    from engine.config.topics import topic_names

    status = MESSAGES[2]
    with fake_schema_registry() as (url, _registry):
        settings = load_settings(
            env={}, namespace="faust-sr", schema_registry_url=url, wire_format="confluent"
        )
        try:
            wire = connect_schema_registry(settings)
            framed = wire.frame(topic_names("faust-sr").status, encode_message(status))
            assert framed is not None and framed[:1] == b"\x00"
            assert codecs.loads(MESSAGE_CODEC, framed) == status
        finally:
            forget_schema_ids()
