"""The engine's Kafka topics: their names, the declarative spec in ``topics/topics.toml``,
the desired state it implies for given settings, and a pure diff against what a cluster has.

A spec may also declare topics of the user's (``[user-topics.NAME]``): the ones workflows
publish to (``publish_topics``) and trigger topics the deployment owns. ``topics apply``
creates them and ``topics check`` reports their drift like the engine's own, so one reviewed
file holds every topic a deployment needs; a running engine still never creates a topic
(a misspelled ``ctx.publish`` topic must fail, not appear).

Everything here is plain data and logic, so it can be tested without a broker; the Kafka
side (describe, create, alter) lives in ``engine.adapters.kafka.admin``.

Why a diff and not "create if missing": the processor relies on co-partitioning (an
instance's commands, results, history and state all live on partition murmur2(id) % P of
their topics). A topic created by hand with another partition count, or a settings change,
would silently send an instance's events to two different processors. The diff names such
drift so that the tools can refuse to run on it.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from engine.codec.contracts import TOPICS, contract_dir
from engine.config.settings import Settings
from engine.core.errors import ConfigurationError
from engine.core.limits import RECORD_OVERHEAD
from engine.core.task_queues import DEFAULT_TASK_QUEUE, check_task_queue

MIN_INSYNC = "min.insync.replicas"
MAX_MESSAGE = "max.message.bytes"
USER_TOPICS = "user-topics"
#: What Kafka accepts as a topic name.
KAFKA_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


# --- names --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicNames:
    """The full topic names for one namespace."""

    commands: str
    activity_tasks: str
    activity_results: str
    instance_messages: str
    history: str
    status: str
    state_changelog: str
    timer_changelog: str
    dead_letters: str
    command_outcomes: str
    replicas: str
    payloads: str

    def names(self) -> tuple[str, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def task_queue(self, queue: str) -> str:
        """The topic of a task queue: ``activity_tasks`` itself for the default queue,
        ``<activity_tasks>.<queue>`` for the others."""
        if queue == DEFAULT_TASK_QUEUE:
            return self.activity_tasks
        return f"{self.activity_tasks}.{check_task_queue(queue)}"

    def is_task_queue(self, topic: str) -> bool:
        """Whether ``topic`` is the topic of some task queue of this namespace."""
        return topic == self.activity_tasks or topic.startswith(self.activity_tasks + ".")


def logical_names() -> tuple[str, ...]:
    """The spec names of every topic (``activity_tasks`` is ``activity-tasks`` in the spec)."""
    return tuple(f.name.replace("_", "-") for f in fields(TopicNames))


def full_name(namespace: str, name: str) -> str:
    return f"{namespace}.{name}"


def topic_names(namespace: str) -> TopicNames:
    """Topic names are ``<namespace>.<name>``, so several engines can share one cluster."""
    if not namespace or any(c in namespace for c in " /\\"):
        raise ConfigurationError(
            f"namespace {namespace!r} cannot prefix Kafka topic names; use letters, digits, "
            f"'.', '_' or '-' (TURNSTILE_NAMESPACE / --namespace)"
        )
    return TopicNames(*(full_name(namespace, n) for n in logical_names()))


# --- the spec -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicSpec:
    name: str
    description: str = ""
    #: None: the settings' partition count.
    partitions: int | None = None
    config: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TopicsSpec:
    topics: tuple[TopicSpec, ...]
    copartitioned: tuple[str, ...]
    source: str = ""
    #: Topics of the user's (``[user-topics.NAME]``): the ones workflows publish to and
    #: trigger topics the deployment owns. Named in full, not under the namespace; created
    #: by ``topics apply`` like the engine's own, never by a running engine.
    user_topics: tuple[TopicSpec, ...] = ()

    def topic(self, name: str) -> TopicSpec:
        for topic in self.topics:
            if topic.name == name:
                return topic
        raise ConfigurationError(f"topic {name!r} is not in the topics spec {self.source}")


def with_task_queues(spec: TopicsSpec, queues: Iterable[str]) -> TopicsSpec:
    """The spec plus one topic per task queue (other than the default), each declared
    like ``activity-tasks`` (its partitions and configs): ``topics apply --task-queue``,
    and the processor and the workers when they meet a queue whose topic is missing."""
    base = spec.topic("activity-tasks")
    have = {t.name for t in spec.topics}
    extra = tuple(
        TopicSpec(
            f"{base.name}.{q}",
            f"Activity attempts of task queue {q!r}.",
            base.partitions,
            base.config,
        )
        for q in sorted({check_task_queue(q) for q in queues} - {DEFAULT_TASK_QUEUE})
        if f"{base.name}.{q}" not in have
    )
    return replace(spec, topics=spec.topics + extra)


def default_spec_path() -> Path:
    """The installed ``topics.toml`` (see :mod:`engine.codec.contracts`)."""
    return contract_dir(TOPICS) / "topics.toml"


def load_spec(path: str | Path | None = None) -> TopicsSpec:
    """Read and validate a topics spec (default: the installed ``topics.toml``)."""
    source = Path(path) if path is not None else default_spec_path()
    try:
        with source.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigurationError(f"topics spec {source} does not exist; pass --spec") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"topics spec {source} is not valid TOML: {exc}") from exc
    return parse_spec(data, str(source))


def parse_spec(data: Mapping[str, Any], source: str = "<spec>") -> TopicsSpec:
    defaults = _str_map(data.get("defaults", {}).get("config", {}), source, "defaults.config")
    table = data.get("topics", {})
    if not isinstance(table, dict):
        raise ConfigurationError(f"{source}: [topics] must be a table of topics")
    topics = tuple(_topic(name, body, defaults, source) for name, body in table.items())
    copartitioned = tuple(data.get("copartition", {}).get("topics", ()))
    spec = TopicsSpec(topics, copartitioned, source, _user_topics(data, defaults, source))
    _validate(spec)
    return spec


def _user_topics(
    data: Mapping[str, Any], defaults: Mapping[str, str], source: str
) -> tuple[TopicSpec, ...]:
    """The ``[user-topics.NAME]`` tables: named in full, so each name must be one that
    Kafka accepts (the engine's own are checked against the list it knows instead)."""
    table = data.get(USER_TOPICS, {})
    if not isinstance(table, dict):
        raise ConfigurationError(f"{source}: [{USER_TOPICS}] must be a table of topics")
    for name in table:
        if not KAFKA_TOPIC_NAME.fullmatch(name) or name in {".", ".."}:
            raise ConfigurationError(
                f"{source}: [{USER_TOPICS}] names {name!r}, which is not a Kafka topic name "
                f"(letters, digits, '.', '_' and '-'; quote a name with dots: "
                f'[{USER_TOPICS}."orders.v1"])'
            )
    return tuple(_topic(name, body, defaults, source, USER_TOPICS) for name, body in table.items())


def _topic(
    name: str, body: Any, defaults: Mapping[str, str], source: str, table: str = "topics"
) -> TopicSpec:
    if not isinstance(body, dict):
        raise ConfigurationError(f"{source}: [{table}.{name}] must be a table")
    unknown = set(body) - {"description", "partitions", "config"}
    if unknown:
        raise ConfigurationError(
            f"{source}: [{table}.{name}] has unknown keys {sorted(unknown)}; known keys are "
            f"description, partitions, config"
        )
    partitions = body.get("partitions")
    if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
        raise ConfigurationError(f"{source}: {table}.{name}.partitions must be a positive integer")
    config = {**defaults, **_str_map(body.get("config", {}), source, f"{table}.{name}.config")}
    return TopicSpec(name, str(body.get("description", "")), partitions, config)


def _str_map(value: Any, source: str, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ConfigurationError(f"{source}: {where} must be a table of Kafka topic configs")
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


def _validate(spec: TopicsSpec) -> None:
    names = [t.name for t in spec.topics]
    missing = sorted(set(logical_names()) - set(names))
    unknown = sorted(set(names) - set(logical_names()))
    if missing or unknown:
        raise ConfigurationError(
            f"{spec.source}: the spec must declare exactly the engine's topics; missing "
            f"{missing}, unknown {unknown}"
        )
    outside = sorted(set(spec.copartitioned) - set(names))
    if outside:
        raise ConfigurationError(f"{spec.source}: [copartition] names unknown topics {outside}")
    fixed = {t.partitions for t in spec.topics if t.name in spec.copartitioned}
    if len(fixed) > 1:
        raise ConfigurationError(
            f"{spec.source}: co-partitioned topics set different partition counts {fixed}; "
            f"they must share one (leave 'partitions' out to use the settings)"
        )


# --- desired state ------------------------------------------------------------------------


@dataclass(frozen=True)
class DesiredTopic:
    name: str
    logical: str
    partitions: int
    replication_factor: int
    config: Mapping[str, str]
    copartitioned: bool
    #: A topic of the user's (``[user-topics]``), named as declared.
    user: bool = False


@dataclass(frozen=True)
class ActualTopic:
    """What a cluster has for one topic (filled in by the Kafka adapter)."""

    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, str]


def auto_replication(brokers: int) -> int:
    """The replication factor ``replication_factor = 0`` stands for on a cluster of
    ``brokers``: 3 where there are three or more (with the spec's ``min.insync.replicas`` of
    2 a write then survives one broker down, and acks=all waits for two copies), else every
    broker there is (1 on a development broker)."""
    return max(1, min(3, brokers))


def desired_topics(spec: TopicsSpec, settings: Settings, *, brokers: int = 1) -> list[DesiredTopic]:
    """The topics the cluster should have for ``settings`` (namespace, partitions, RF);
    an automatic replication factor (0) is chosen for a cluster of ``brokers``. The spec's
    user topics come last, named as declared."""
    replication = settings.replication_factor or auto_replication(brokers)
    if settings.partitions < 1 or settings.replication_factor < 0:
        raise ConfigurationError(
            f"partitions ({settings.partitions}) must be at least 1 and the replication "
            f"factor ({settings.replication_factor}) at least 0 (automatic)"
        )
    out = []
    for name, topic, user, copartitioned in _named_topics(spec, settings.namespace):
        config = dict(topic.config)
        if MIN_INSYNC in config:
            config[MIN_INSYNC] = str(min(int(config[MIN_INSYNC]), replication))
        config[MAX_MESSAGE] = _max_message_bytes(topic, config, settings)
        out.append(
            DesiredTopic(
                name=name,
                logical=topic.name,
                partitions=topic.partitions or settings.partitions,
                replication_factor=replication,
                config=config,
                copartitioned=copartitioned,
                user=user,
            )
        )
    return out


def _named_topics(spec: TopicsSpec, namespace: str) -> list[tuple[str, TopicSpec, bool, bool]]:
    """Each declared topic with its full name, whether it is the user's and whether it is
    co-partitioned: the engine's under the namespace, the user's as named (never
    co-partitioned)."""
    engine = [
        (full_name(namespace, t.name), t, False, t.name in spec.copartitioned) for t in spec.topics
    ]
    taken = {name for name, *_ in engine}
    clashes = sorted(t.name for t in spec.user_topics if t.name in taken)
    if clashes:
        raise ConfigurationError(
            f"{spec.source}: [{USER_TOPICS}] declares {', '.join(clashes)}, a topic of the "
            f"engine in namespace {namespace!r}; name a topic of your own"
        )
    return [*engine, *((t.name, t, True, False) for t in spec.user_topics)]


def topic_max_message_bytes(settings: Settings) -> int:
    """What every topic must accept: the largest record the engine writes (its size
    limits) plus room for the batch framing around it."""
    return settings.max_record_bytes + RECORD_OVERHEAD


def _max_message_bytes(topic: TopicSpec, config: Mapping[str, str], settings: Settings) -> str:
    needed = topic_max_message_bytes(settings)
    declared = config.get(MAX_MESSAGE)
    if declared is not None and int(declared) < needed:
        raise ConfigurationError(
            f"topic {topic.name} declares {MAX_MESSAGE}={declared}, below the "
            f"{needed} bytes the size limits need (max_record_bytes + {RECORD_OVERHEAD}); "
            f"remove it from topics.toml or lower max_record_bytes"
        )
    return str(needed) if declared is None else declared


# --- diff ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drift:
    """One difference between the desired and the actual topics."""

    #: "missing", "partitions", "copartition", "replication" or "config".
    kind: str
    topic: str
    detail: str
    key: str = ""
    expected: str = ""
    actual: str = ""

    def to_json(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v != ""}


@dataclass(frozen=True)
class TopicDiff:
    missing: tuple[DesiredTopic, ...] = ()
    drifts: tuple[Drift, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.missing and not self.drifts

    def of_kind(self, *kinds: str) -> list[Drift]:
        return [d for d in self.drifts if d.kind in kinds]

    @property
    def blocking(self) -> list[Drift]:
        """Drift that no tool may repair automatically: it would move instances."""
        return self.of_kind("partitions", "copartition")

    def all_drifts(self) -> list[Drift]:
        missing = [
            Drift("missing", t.name, f"does not exist (wants {t.partitions} partitions)")
            for t in self.missing
        ]
        return [*missing, *self.drifts]


def diff_topics(desired: Iterable[DesiredTopic], actual: Mapping[str, ActualTopic]) -> TopicDiff:
    """Compare desired topics with a cluster's; pure, so every case is unit-testable."""
    desired = list(desired)
    missing = tuple(t for t in desired if t.name not in actual)
    drifts: list[Drift] = []
    for want in desired:
        have = actual.get(want.name)
        if have is not None:
            drifts.extend(_topic_drift(want, have))
    drifts.extend(_copartition_drift(desired, actual))
    return TopicDiff(missing, tuple(drifts))


def _topic_drift(want: DesiredTopic, have: ActualTopic) -> list[Drift]:
    out = []
    if have.partitions != want.partitions:
        out.append(
            Drift(
                "partitions",
                want.name,
                _partition_advice(want, have.partitions),
                expected=str(want.partitions),
                actual=str(have.partitions),
            )
        )
    if have.replication_factor != want.replication_factor:
        out.append(
            Drift(
                "replication",
                want.name,
                f"replication factor is {have.replication_factor}, the settings ask for "
                f"{want.replication_factor}; reassign partitions with Kafka's tools or set "
                f"TURNSTILE_REPLICATION_FACTOR={have.replication_factor}",
                expected=str(want.replication_factor),
                actual=str(have.replication_factor),
            )
        )
    for key, value in sorted(want.config.items()):
        current = have.config.get(key)
        if current != value:
            out.append(
                Drift(
                    "config",
                    want.name,
                    f"{key} is {current!r}, the spec says {value!r}",
                    key=key,
                    expected=value,
                    actual="" if current is None else current,
                )
            )
    return out


def _partition_advice(want: DesiredTopic, actual: int) -> str:
    if want.user:
        return (
            f"has {actual} partitions, the spec declares {want.partitions}. The tools never "
            f"change a partition count: set partitions = {actual} in [{USER_TOPICS}."
            f"{want.name}] to use the topic as it is, or change it with Kafka's tools"
        )
    return (
        f"has {actual} partitions, the settings ask for {want.partitions}. A partition count "
        f"cannot change without moving instances between partitions: set partitions to "
        f"{actual} (TURNSTILE_PARTITIONS={actual} or --partitions {actual}) to use the "
        f"cluster as it is, or start over in a new namespace"
    )


def _copartition_drift(
    desired: list[DesiredTopic], actual: Mapping[str, ActualTopic]
) -> list[Drift]:
    """Co-partitioned topics that exist must agree with each other, and topics about to be
    created must match the ones that already exist."""
    group = [t for t in desired if t.copartitioned]
    counts = {t.name: actual[t.name].partitions for t in group if t.name in actual}
    if not counts:
        return []
    distinct = sorted(set(counts.values()))
    out = []
    if len(distinct) > 1:
        listing = ", ".join(f"{n}={c}" for n, c in sorted(counts.items()))
        out.append(
            Drift(
                "copartition",
                ", ".join(sorted(counts)),
                f"co-partitioned topics have different partition counts ({listing}); "
                f"instances are split across processors. Recreate the odd topics with one "
                f"count (losing their data) or migrate to a new namespace",
            )
        )
    existing = distinct[0] if len(distinct) == 1 else None
    for topic in group:
        if topic.name not in actual and existing is not None and topic.partitions != existing:
            out.append(
                Drift(
                    "copartition",
                    topic.name,
                    f"would be created with {topic.partitions} partitions but its "
                    f"co-partitioned topics have {existing}; set partitions to {existing}",
                    expected=str(existing),
                    actual=str(topic.partitions),
                )
            )
    return out
