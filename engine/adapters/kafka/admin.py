"""Topic administration on a real cluster: describe the engine's topics, create the missing
ones, and repair config drift when asked, following ``topics/topics.toml``.

The decisions (what is missing, what drifted, what must not be touched) are made by the pure
diff in ``engine.config.topics``; this module only talks to Kafka. It never changes a
partition count: that would move instances between partitions behind the processors' back.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from engine.adapters.kafka.config import admin_config
from engine.adapters.kafka.logs import unreachable_message, watch_of
from engine.config.settings import Settings
from engine.config.topics import (
    ActualTopic,
    DesiredTopic,
    Drift,
    TopicDiff,
    TopicsSpec,
    desired_topics,
    diff_topics,
    load_spec,
    topic_names,
    with_task_queues,
)
from engine.core.errors import BrokerError, BrokerUnreachableError, TopicDriftError

DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True)
class ApplyResult:
    created: tuple[str, ...]
    altered: tuple[Drift, ...]
    #: What still differs afterwards (config drift left alone, replication factor).
    remaining: TopicDiff


def admin_for(settings: Settings) -> Any:
    config = {**admin_config(settings.bootstrap_servers, client_id="turnstile-topics")}
    config.update(settings.extra_kafka)
    return AdminClient(config)


def ensure_reachable(settings: Settings, timeout_s: float) -> None:
    """Return once Kafka at the settings' address answers a metadata request; raise
    BrokerUnreachableError after ``timeout_s`` saying why (refused, unresolvable host, not
    a Kafka port, TLS/SASL) and what to do."""
    config = {**admin_config(settings.bootstrap_servers, client_id="turnstile-connect")}
    config.update(settings.extra_kafka)
    watch = watch_of(config)
    admin = AdminClient(config)
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException:
        admin.poll(0)  # error callbacks run from poll: collect what went wrong
        detail = watch.last if watch is not None else None
        raise BrokerUnreachableError(
            unreachable_message(settings.bootstrap_servers, detail, timeout_s)
        ) from None


def ensure_topics(settings: Settings, spec: TopicsSpec, timeout_s: float) -> None:
    """Refuse to run a processor on topics it cannot use: missing ones, or a partition count
    other than the settings' (records would land on partitions no instance maps to)."""
    diff = check(spec, settings, timeout=timeout_s)
    if diff.missing:
        names = ", ".join(t.name for t in diff.missing)
        raise TopicDriftError(
            f"the engine's topics do not exist yet ({names}); create them once with "
            f"'turnstile topics apply --namespace {settings.namespace} --partitions "
            f"{settings.partitions}'"
        )
    if diff.blocking:
        raise TopicDriftError(
            "the topics do not match the settings:\n"
            + "\n".join(f"  {d.topic}: {d.detail}" for d in diff.blocking)
            + "\nrun every process with the partition count the topics were created with "
            "(--partitions or TURNSTILE_PARTITIONS)"
        )


def existing_topics(settings: Settings, names: Iterable[str], timeout_s: float) -> set[str]:
    """Which of the named (user) topics exist: a metadata request, nothing is created."""
    try:
        metadata = admin_for(settings).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise _broker_error(settings, "list the topics", exc) from exc
    return {n for n in names if n in metadata.topics and metadata.topics[n].error is None}


def _broker_error(settings: Settings, action: str, exc: Exception) -> BrokerError:
    return BrokerError(
        f"could not {action} on Kafka at {settings.bootstrap_servers}: {exc}. Check that the "
        f"broker runs (python -m engine dev kafka start) and --bootstrap-servers points at it."
    )


def describe(
    admin: Any, names: Iterable[str], timeout: float = DEFAULT_TIMEOUT
) -> dict[str, ActualTopic]:
    """The named topics that exist, with partition count, replication factor and configs."""
    metadata = admin.list_topics(timeout=timeout)
    present = [n for n in names if n in metadata.topics and metadata.topics[n].error is None]
    if not present:
        return {}
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in present]
    futures = admin.describe_configs(resources, request_timeout=timeout)
    configs: dict[str, dict[str, str]] = {}
    for resource, future in futures.items():
        entries: Mapping[str, Any] = future.result(timeout=timeout)
        configs[resource.name] = {k: e.value for k, e in entries.items() if e.value is not None}
    out = {}
    for name in present:
        partitions = metadata.topics[name].partitions
        replication = max((len(p.replicas) for p in partitions.values()), default=0)
        out[name] = ActualTopic(name, len(partitions), replication, configs.get(name, {}))
    return out


def check(
    spec: TopicsSpec, settings: Settings, admin: Any = None, timeout: float = DEFAULT_TIMEOUT
) -> TopicDiff:
    """How the cluster differs from the spec (empty diff: all is as declared)."""
    admin = admin or admin_for(settings)
    try:
        # an automatic replication factor (0) follows the cluster's size
        brokers = 1 if settings.replication_factor else broker_count(admin, timeout)
        desired = desired_topics(spec, settings, brokers=brokers)
        actual = describe(admin, [t.name for t in desired], timeout)
    except KafkaException as exc:
        raise _broker_error(settings, "describe the topics", exc) from exc
    return diff_topics(desired, actual)


def broker_count(admin: Any, timeout: float = DEFAULT_TIMEOUT) -> int:
    """How many brokers the cluster has: the live ones its metadata lists, and any other
    that holds a replica (one that is down for a restart still counts)."""
    metadata = admin.list_topics(timeout=timeout)
    ids = set(metadata.brokers)
    for topic in metadata.topics.values():
        for partition in topic.partitions.values():
            ids.update(partition.replicas)
    return len(ids)


def apply(
    spec: TopicsSpec,
    settings: Settings,
    *,
    fix_config: bool = False,
    admin: Any = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> ApplyResult:
    """Create missing topics; with ``fix_config``, set drifted configs back to the spec.

    Raises TopicDriftError, changing nothing, when partition counts drifted or
    co-partitioning would break: those need a decision by a person.
    """
    admin = admin or admin_for(settings)
    diff = check(spec, settings, admin, timeout)
    if diff.blocking:
        raise TopicDriftError(
            "refusing to change topics, partition counts differ from what the engine needs:\n"
            + "\n".join(f"  {d.topic}: {d.detail}" for d in diff.blocking)
        )
    try:
        created = _create(admin, diff.missing, timeout)
        altered = _alter(admin, diff.of_kind("config"), timeout) if fix_config else ()
    except KafkaException as exc:
        raise _broker_error(settings, "create or alter topics", exc) from exc
    remaining = _settled(spec, settings, admin, created, timeout)
    return ApplyResult(created, altered, remaining)


def _create(admin: Any, missing: Iterable[DesiredTopic], timeout: float) -> tuple[str, ...]:
    topics = [
        NewTopic(
            t.name,
            num_partitions=t.partitions,
            replication_factor=t.replication_factor,
            config=dict(t.config),
        )
        for t in missing
    ]
    if not topics:
        return ()
    created = []
    for name, future in admin.create_topics(topics, operation_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue  # created concurrently by another apply: the check below sees it
            raise
        created.append(name)
    return tuple(created)


def _alter(admin: Any, drifts: list[Drift], timeout: float) -> tuple[Drift, ...]:
    by_topic: dict[str, list[Drift]] = {}
    for drift in drifts:
        by_topic.setdefault(drift.topic, []).append(drift)
    resources = [
        ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(d.key, d.expected, incremental_operation=AlterConfigOpType.SET)
                for d in items
            ],
        )
        for topic, items in by_topic.items()
    ]
    if not resources:
        return ()
    for future in admin.incremental_alter_configs(resources, request_timeout=timeout).values():
        future.result(timeout=timeout)
    return tuple(drifts)


def _settled(
    spec: TopicsSpec, settings: Settings, admin: Any, created: tuple[str, ...], timeout: float
) -> TopicDiff:
    """The diff after changes, once new topics show up in the cluster metadata."""
    deadline = time.monotonic() + timeout
    while True:
        diff = check(spec, settings, admin, timeout)
        pending = {t.name for t in diff.missing} & set(created)
        if not pending or time.monotonic() > deadline:
            return diff
        time.sleep(0.2)


# --- task queues ----------------------------------------------------------------------------


def ensure_task_queue_topics(
    settings: Settings,
    queues: Iterable[str],
    *,
    admin: Any = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, int]:
    """Create the topics of task queues that do not exist yet (declared like
    ``activity-tasks``, see ``with_task_queues``); returns each queue topic's partition
    count. The default queue's topic is the engine's own ``activity-tasks``, made by
    ``topics apply``; it is only described here."""
    queues = list(queues)
    admin = admin or admin_for(settings)
    spec = with_task_queues(load_spec(), queues)
    names = topic_names(settings.namespace)
    wanted = {names.task_queue(q) for q in queues}
    desired = [t for t in desired_topics(spec, settings) if t.name in wanted]
    try:
        actual = describe(admin, [t.name for t in desired], timeout)
        missing = [t for t in desired if t.name not in actual and t.logical != "activity-tasks"]
        if missing:
            _create(admin, missing, timeout)
            actual = describe(admin, [t.name for t in desired], timeout)
    except KafkaException as exc:
        raise _broker_error(settings, "create the task queue topics", exc) from exc
    return {name: topic.partitions for name, topic in actual.items()}


class TaskQueueTopics:
    """The processor's view of task-queue topics: before a batch produces to a queue topic
    it has not seen, the topic is created if missing, so a call to a new task queue
    never makes a transaction wait for a topic that does not exist (the partition would
    stall). One admin request per new queue and process; known topics cost a set lookup."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._names = topic_names(settings.namespace)
        self._known: set[str] = {self._names.activity_tasks}
        self._admin: Any = None

    def ensure(self, topics: Iterable[str]) -> None:
        new = {t for t in topics if t not in self._known and self._names.is_task_queue(t)}
        if not new:
            return
        prefix = self._names.activity_tasks + "."
        if self._admin is None:
            self._admin = admin_for(self._settings)
        queues = [t[len(prefix) :] for t in new]
        made = ensure_task_queue_topics(self._settings, queues, admin=self._admin)
        self._known.update(t for t in new if t in made)
