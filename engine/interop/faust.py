"""faust-streaming codecs for the engine's records, so a faust agent can talk to the engine.

Install the extra (``pip install 'turnstile-engine[faust]'``), call :func:`register_codecs`
once, and the engine's topics are ordinary faust topics::

    app = faust.App("shop", broker="kafka://127.0.0.1:9092")
    commands = commands_topic(app, "turnstile")     # send StartWorkflow / RaiseEvent
    statuses = status_topic(app, "turnstile")       # InstanceStatus records
    outcomes = outcomes_topic(app, "turnstile")     # CommandOutcome records

Values are the engine's own dataclasses (``engine.core.messages``) encoded exactly as the
engine's client encodes them (single-object Avro, see ``schemas/README.md``); keys are the
instance ids as UTF-8 (``raw``), and faust's producer partitions with murmur2 like the
engine. An undecodable value raises the codec's ``CodecError`` inside faust, which faust
reports for that record; the processor, not faust, validates every command it receives.

This bridge sits outside the exactly-once path on purpose: the processor's turns stay on
confluent-kafka, because faust's transactions cover the offsets of its source topics but
leave the records it sends to other topics, and its table writes, outside the commit.
"""

from __future__ import annotations

from typing import Any

from faust.serializers import codecs

from engine.codec import decode_history, decode_message, encode_history, encode_message
from engine.config.topics import topic_names
from engine.core.errors import CodecError
from engine.core.history import HistoryEvent
from engine.core.messages import Message

__all__ = [
    "HISTORY_CODEC",
    "MESSAGE_CODEC",
    "HistoryCodec",
    "MessageCodec",
    "commands_topic",
    "history_topic",
    "outcomes_topic",
    "register_codecs",
    "status_topic",
]

#: The names under which :func:`register_codecs` registers the codecs with faust.
MESSAGE_CODEC = "turnstile"
HISTORY_CODEC = "turnstile-history"


class MessageCodec(codecs.Codec):
    """Commands, statuses, command outcomes (any engine message) <-> record values."""

    def _dumps(self, obj: Any) -> bytes:
        if not isinstance(obj, Message):
            raise CodecError(
                f"the {MESSAGE_CODEC!r} codec writes engine messages (StartWorkflow, "
                f"RaiseEvent... from engine.core.messages), got a {type(obj).__name__}"
            )
        return encode_message(obj)

    def _loads(self, s: bytes) -> Any:
        return decode_message(s)


class HistoryCodec(codecs.Codec):
    """History events <-> record values (reading the history topic from faust)."""

    def _dumps(self, obj: Any) -> bytes:
        if not isinstance(obj, HistoryEvent):
            raise CodecError(
                f"the {HISTORY_CODEC!r} codec writes HistoryEvent records, got a "
                f"{type(obj).__name__}; history is the processor's to write"
            )
        return encode_history(obj)

    def _loads(self, s: bytes) -> Any:
        return decode_history(s)


def register_codecs() -> None:
    """Make ``"turnstile"`` and ``"turnstile-history"`` usable as faust serializers."""
    codecs.register(MESSAGE_CODEC, MessageCodec())
    codecs.register(HISTORY_CODEC, HistoryCodec())


def _topic(app: Any, name: str, codec: str) -> Any:
    register_codecs()
    return app.topic(name, key_serializer="raw", value_serializer=codec)


def commands_topic(app: Any, namespace: str = "turnstile") -> Any:
    """The engine's commands topic of ``namespace`` as a faust topic (send commands)."""
    return _topic(app, topic_names(namespace).commands, MESSAGE_CODEC)


def status_topic(app: Any, namespace: str = "turnstile") -> Any:
    """The status topic (compacted, latest InstanceStatus per instance)."""
    return _topic(app, topic_names(namespace).status, MESSAGE_CODEC)


def outcomes_topic(app: Any, namespace: str = "turnstile") -> Any:
    """The command-outcomes topic (the processor's CommandOutcome per command)."""
    return _topic(app, topic_names(namespace).command_outcomes, MESSAGE_CODEC)


def history_topic(app: Any, namespace: str = "turnstile") -> Any:
    """The history topic (every instance's HistoryEvent records, read-only)."""
    return _topic(app, topic_names(namespace).history, HISTORY_CODEC)
