"""A Confluent-compatible Schema Registry over its REST API, and the wire format it enables.

With ``schema_registry_url`` set, a process can read records in the registry's wire format
(magic byte, schema id, Avro): the codec looks up an id it does not know with
``GET /schemas/ids/{id}``, once. With ``wire_format = "confluent"`` as well, the processor
registers the current ``HistoryEvent``, ``InstanceStatus`` and ``CommandOutcome`` schemas
under the TopicNameStrategy subjects (``<topic>-value``) at start-up and writes those three
topics in that format, so Kafka Connect, ksqlDB, Flink or any registry-aware consumer reads
them with its own deserializer. Everything is checked before the process joins its group:
a registry that does not answer, or refuses a schema (its compatibility rule), stops the
start with the reason. The client is plain ``urllib`` with a cache: the engine asks the
registry a handful of questions per process, not one per record.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.codec import current_schema
from engine.codec.confluent import learn_schema_id, to_confluent, use_schema_resolver
from engine.config.settings import CONFLUENT_WIRE_FORMAT, Settings
from engine.config.topics import topic_names
from engine.core.errors import SchemaRegistryError

__all__ = [
    "CONFLUENT_TOPICS",
    "SINGLE_OBJECT",
    "SchemaRegistryClient",
    "WireFormat",
    "connect_schema_registry",
    "subject_of",
]

#: The registry's media type for requests and answers.
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

#: The topics written in the registry's format in ``confluent`` mode (by their
#: ``TopicNames`` field) and the record schema of each.
CONFLUENT_TOPICS: Mapping[str, str] = {
    "history": "HistoryEvent",
    "status": "InstanceStatus",
    "command_outcomes": "CommandOutcome",
}


def subject_of(topic: str) -> str:
    """The TopicNameStrategy subject of a topic's values."""
    return f"{topic}-value"


class SchemaRegistryClient:
    """The few REST calls the engine needs, each answer cached for the process's life
    (a registered schema's id never changes)."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._ids: dict[tuple[str, str], int] = {}
        self._schemas: dict[int, str] = {}
        self._lock = threading.Lock()

    def register(self, subject: str, schema_json: str) -> int:
        """Register ``schema_json`` under ``subject`` (a schema already there keeps its id)."""
        key = (subject, schema_json)
        with self._lock:
            if key in self._ids:
                return self._ids[key]
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        answer = self._call("POST", path, {"schema": schema_json}, f"registering {subject}")
        schema_id = _int_field(answer, "id", f"registering {subject}")
        with self._lock:
            self._ids[key] = schema_id
            self._schemas[schema_id] = schema_json
        return schema_id

    def schema(self, schema_id: int) -> str:
        """The schema JSON the registry keeps under ``schema_id``."""
        with self._lock:
            if schema_id in self._schemas:
                return self._schemas[schema_id]
        what = f"looking up schema id {schema_id}"
        answer = self._call("GET", f"/schemas/ids/{schema_id}", None, what)
        text = answer.get("schema")
        if not isinstance(text, str):
            raise SchemaRegistryError(f"{self.url}: {what}: the answer has no schema: {answer}")
        with self._lock:
            self._schemas[schema_id] = text
        return text

    def subjects(self) -> list[str]:
        """Every subject (the cheapest call that proves the registry answers)."""
        answer = self._call("GET", "/subjects", None, "listing subjects")
        if not isinstance(answer, list):
            raise SchemaRegistryError(f"{self.url}: /subjects did not answer a list: {answer}")
        return [str(s) for s in answer]

    def _call(self, method: str, path: str, body: object, what: str) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise self._refusal(exc, what) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SchemaRegistryError(
                f"the Schema Registry at {self.url} does not answer ({what}: {reason}); start "
                f"it, or fix schema_registry_url (TURNSTILE_SCHEMA_REGISTRY_URL)"
            ) from None
        except ValueError as exc:
            raise SchemaRegistryError(
                f"{self.url} answered {what} with something that is not JSON ({exc}); is "
                f"schema_registry_url the address of a Schema Registry?"
            ) from None

    def _refusal(self, exc: urllib.error.HTTPError, what: str) -> SchemaRegistryError:
        try:
            detail = json.loads(exc.read() or b"{}")
        except ValueError:
            detail = {}
        message = detail.get("message") if isinstance(detail, dict) else None
        hint = (
            "the subject's compatibility rule rejects the engine's schema: set the subject's "
            "compatibility (PUT /config/<subject>) or use another namespace"
            if exc.code == 409
            else "check schema_registry_url and the registry's access rules"
        )
        return SchemaRegistryError(
            f"the Schema Registry at {self.url} refused {what}: HTTP {exc.code} "
            f"{message or exc.reason}; {hint}"
        )


def _int_field(answer: Any, name: str, what: str) -> int:
    value = answer.get(name) if isinstance(answer, dict) else None
    if not isinstance(value, int) or isinstance(value, bool):
        raise SchemaRegistryError(f"{what}: the registry's answer has no {name}: {answer}")
    return value


@dataclass(frozen=True)
class WireFormat:
    """How the processor frames what it writes: the registry's schema id per topic written
    in the Confluent format; every other topic stays single-object encoded."""

    schema_ids: Mapping[str, int] = field(default_factory=dict)

    def frame(self, topic: str, value: bytes | None) -> bytes | None:
        schema_id = self.schema_ids.get(topic)
        if schema_id is None or value is None:
            return value
        return to_confluent(value, schema_id)


#: The default: every record single-object encoded, no registry.
SINGLE_OBJECT = WireFormat()

_CLIENTS: dict[str, SchemaRegistryClient] = {}
_FORMATS: dict[tuple[str, str, str], WireFormat] = {}
_CLIENTS_LOCK = threading.Lock()


def connect_schema_registry(settings: Settings) -> WireFormat:
    """Check the configured registry and teach the codec its ids; the wire format to write.

    No registry configured: single-object encoding, nothing asked. A registry: it must
    answer (SchemaRegistryError otherwise), the codec resolves unknown ids through it, and
    in ``confluent`` mode the three topics' schemas are registered. Once per process and
    settings: later calls return the cached answer.
    """
    url = settings.schema_registry_url
    if not url:
        return SINGLE_OBJECT
    key = (url, settings.namespace, settings.wire_format)
    with _CLIENTS_LOCK:
        if key in _FORMATS:
            return _FORMATS[key]
        client = _CLIENTS.setdefault(url, SchemaRegistryClient(url, settings.connect_timeout_s))
    client.subjects()
    use_schema_resolver(client.schema)
    wire = SINGLE_OBJECT
    if settings.wire_format == CONFLUENT_WIRE_FORMAT:
        wire = WireFormat(_register_topics(client, settings.namespace))
    with _CLIENTS_LOCK:
        _FORMATS[key] = wire
    return wire


def _register_topics(client: SchemaRegistryClient, namespace: str) -> dict[str, int]:
    names = topic_names(namespace)
    ids: dict[str, int] = {}
    for field_name, record in CONFLUENT_TOPICS.items():
        topic = getattr(names, field_name)
        text = json.dumps(current_schema(record).raw)
        schema_id = client.register(subject_of(topic), text)
        learn_schema_id(schema_id, text)
        ids[topic] = schema_id
    return ids
