"""The declarative topics spec, the desired state it implies and the pure drift diff."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from engine.config.settings import Settings
from engine.config.topics import (
    ActualTopic,
    DesiredTopic,
    default_spec_path,
    desired_topics,
    diff_topics,
    load_spec,
    logical_names,
    parse_spec,
    topic_names,
    with_task_queues,
)
from engine.core.errors import ConfigurationError

SPEC = load_spec()
SETTINGS = Settings(namespace="shop", partitions=12, replication_factor=3)
COPARTITIONED = {
    "commands",
    "activity-results",
    "instance-messages",
    "history",
    "status",
    "state-changelog",
    "timer-changelog",
    "payloads",
}


def _as_cluster(desired: list[DesiredTopic]) -> dict[str, ActualTopic]:
    return {
        t.name: ActualTopic(t.name, t.partitions, t.replication_factor, dict(t.config))
        for t in desired
    }


def test_names_are_namespaced() -> None:
    names = topic_names("shop")
    assert names.commands == "shop.commands"
    assert names.activity_tasks == "shop.activity-tasks"
    assert names.state_changelog == "shop.state-changelog"
    assert len(set(names.names())) == len(logical_names()) == 12
    with pytest.raises(ConfigurationError):
        topic_names("")


def test_spec_declares_every_topic_once() -> None:
    assert default_spec_path() == Path(__file__).resolve().parents[2] / "topics" / "topics.toml"
    assert sorted(t.name for t in SPEC.topics) == sorted(logical_names())
    assert set(SPEC.copartitioned) == COPARTITIONED
    compacted = {t.name for t in SPEC.topics if t.config["cleanup.policy"] == "compact"}
    assert compacted == {"status", "state-changelog", "timer-changelog", "replicas", "payloads"}
    assert SPEC.topic("history").config["retention.ms"] == "-1"


def test_desired_state_follows_settings() -> None:
    desired = {t.logical: t for t in desired_topics(SPEC, SETTINGS)}
    assert desired["history"].name == "shop.history"
    assert {t.partitions for t in desired.values() if t.logical != "replicas"} == {12}
    assert desired["replicas"].partitions == 1  # one record per replica: one partition
    assert {t.replication_factor for t in desired.values()} == {3}
    assert desired["status"].config["min.insync.replicas"] == "2"
    single = desired_topics(SPEC, dataclasses.replace(SETTINGS, replication_factor=1))
    assert {t.config["min.insync.replicas"] for t in single} == {"1"}


@pytest.mark.parametrize(
    ("brokers", "replicas", "in_sync"), [(1, 1, "1"), (3, 3, "2"), (5, 3, "2")]
)
def test_an_automatic_replication_factor_follows_the_cluster(
    brokers: int, replicas: int, in_sync: str
) -> None:
    """replication_factor = 0 (the default): 3 replicas with 2 in sync on a cluster of three
    or more brokers, one replica on a development broker."""
    automatic = dataclasses.replace(SETTINGS, replication_factor=0)
    desired = desired_topics(SPEC, automatic, brokers=brokers)
    assert {t.replication_factor for t in desired} == {replicas}
    assert {t.config["min.insync.replicas"] for t in desired} == {in_sync}


def test_matching_cluster_is_clean() -> None:
    desired = desired_topics(SPEC, SETTINGS)
    diff = diff_topics(desired, _as_cluster(desired))
    assert diff.clean and not diff.all_drifts()


def test_missing_topics_are_listed() -> None:
    desired = desired_topics(SPEC, SETTINGS)
    cluster = _as_cluster(desired)
    del cluster["shop.history"], cluster["shop.dead-letters"]
    diff = diff_topics(desired, cluster)
    assert {t.name for t in diff.missing} == {"shop.history", "shop.dead-letters"}
    assert not diff.blocking


def test_partition_drift_blocks_and_advises() -> None:
    desired = desired_topics(SPEC, SETTINGS)
    cluster = {
        name: dataclasses.replace(t, partitions=6) for name, t in _as_cluster(desired).items()
    }
    diff = diff_topics(desired, cluster)
    drift = diff.of_kind("partitions")
    assert len(drift) == len(logical_names()) and diff.blocking
    assert "TURNSTILE_PARTITIONS=6" in drift[0].detail
    assert not diff.of_kind("copartition")  # they agree with each other


def test_copartition_violations() -> None:
    desired = desired_topics(SPEC, SETTINGS)
    cluster = _as_cluster(desired)
    cluster["shop.status"] = dataclasses.replace(cluster["shop.status"], partitions=4)
    diff = diff_topics(desired, cluster)
    assert [d.kind for d in diff.blocking] == ["partitions", "copartition"]
    assert "shop.status=4" in diff.of_kind("copartition")[0].detail


def test_creating_into_a_mismatched_group_is_a_violation() -> None:
    desired = desired_topics(SPEC, SETTINGS)
    cluster = {
        n: dataclasses.replace(t, partitions=8)
        for n, t in _as_cluster(desired).items()
        if n != "shop.history"
    }
    diff = diff_topics(desired, cluster)
    violation = [d for d in diff.of_kind("copartition") if d.topic == "shop.history"]
    assert violation and violation[0].expected == "8"


def test_activity_tasks_may_differ() -> None:
    desired = desired_topics(SPEC, SETTINGS)
    cluster = _as_cluster(desired)
    cluster["shop.activity-tasks"] = dataclasses.replace(
        cluster["shop.activity-tasks"], partitions=3
    )
    diff = diff_topics(desired, cluster)
    assert [d.kind for d in diff.drifts] == ["partitions"]
    assert not diff.of_kind("copartition")


def test_config_and_replication_drift() -> None:
    desired = desired_topics(SPEC, SETTINGS)
    cluster = _as_cluster(desired)
    history = cluster["shop.history"]
    cluster["shop.history"] = dataclasses.replace(
        history, replication_factor=1, config={**history.config, "retention.ms": "1000"}
    )
    diff = diff_topics(desired, cluster)
    kinds = {d.kind: d for d in diff.drifts}
    assert set(kinds) == {"config", "replication"}
    assert kinds["config"].key == "retention.ms" and kinds["config"].actual == "1000"
    assert not diff.blocking
    assert kinds["config"].to_json()["expected"] == "-1"


def test_spec_validation() -> None:
    with pytest.raises(ConfigurationError, match="missing"):
        parse_spec({"topics": {"commands": {}}})
    good: dict[str, Any] = {
        "copartition": {"topics": ["commands", "history"]},
        "topics": {name: {} for name in logical_names()},
    }
    assert parse_spec(good).topic("commands").partitions is None
    bad = {**good, "topics": {**good["topics"], "history": {"partitions": 4}}}
    with pytest.raises(ConfigurationError, match="different partition counts"):
        parse_spec(bad)
    typo = {**good, "topics": {**good["topics"], "history": {"partition": 4}}}
    with pytest.raises(ConfigurationError, match="unknown keys"):
        parse_spec(typo)
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_spec("/nonexistent/topics.toml")


# --- user topics ----------------------------------------------------------------------------

USER_TOPICS = """
[user-topics.order-events]
description = "Order state changes."
partitions = 6
config = { "retention.ms" = "86400000" }

[user-topics."orders.v1"]
"""


def _spec_with_user_topics(tmp_path: Path, extra: str = USER_TOPICS) -> Any:
    path = tmp_path / "topics.toml"
    path.write_text(default_spec_path().read_text(encoding="utf-8") + extra, encoding="utf-8")
    return load_spec(path)


def test_user_topics_are_declared_in_full_beside_the_engines(tmp_path: Path) -> None:
    spec = _spec_with_user_topics(tmp_path)
    assert [t.name for t in spec.topics] == [t.name for t in SPEC.topics]
    desired = {t.name: t for t in desired_topics(spec, SETTINGS)}
    assert len(desired) == len(logical_names()) + 2
    events, versioned = desired["order-events"], desired["orders.v1"]
    assert (events.partitions, versioned.partitions) == (6, SETTINGS.partitions)
    assert events.user and versioned.user and not desired["shop.commands"].user
    assert not events.copartitioned and not versioned.copartitioned
    # the spec's defaults and the record size limits apply as to the engine's topics
    assert events.config["retention.ms"] == "86400000"
    assert events.config["min.insync.replicas"] == "2"
    assert events.config["max.message.bytes"] == desired["shop.history"].config["max.message.bytes"]
    # task queues add to the spec without dropping them
    queued = with_task_queues(spec, ["gpu"])
    assert queued.user_topics == spec.user_topics
    assert "order-events" in {t.name for t in desired_topics(queued, SETTINGS)}


def test_user_topics_drift_like_the_engines(tmp_path: Path) -> None:
    desired = desired_topics(_spec_with_user_topics(tmp_path), SETTINGS)
    cluster = _as_cluster(desired)
    del cluster["orders.v1"]
    cluster["order-events"] = dataclasses.replace(cluster["order-events"], partitions=3)
    diff = diff_topics(desired, cluster)
    assert [t.name for t in diff.missing] == ["orders.v1"]
    [drift] = diff.blocking
    assert drift.topic == "order-events" and drift.kind == "partitions"
    assert "set partitions = 3 in [user-topics.order-events]" in drift.detail


def test_user_topics_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not a Kafka topic name"):
        _spec_with_user_topics(tmp_path, '[user-topics."order events"]\n')
    with pytest.raises(ConfigurationError, match=r"\[user-topics.out\] has unknown keys"):
        _spec_with_user_topics(tmp_path, "[user-topics.out]\npartition = 3\n")
    clash = _spec_with_user_topics(tmp_path, '[user-topics."shop.history"]\n')
    with pytest.raises(ConfigurationError, match="a topic of the engine in namespace 'shop'"):
        desired_topics(clash, SETTINGS)


def test_cli_reports_an_unreachable_broker_with_advice() -> None:
    import argparse

    from engine.cli import topics
    from engine.core.errors import BrokerError

    parser = argparse.ArgumentParser(prog="turnstile")
    topics.register(parser.add_subparsers())
    args = parser.parse_args(
        ["topics", "check", "--bootstrap-servers", "127.0.0.1:1", "--timeout", "1"]
    )
    with pytest.raises(BrokerError, match="dev kafka start"):
        args.handler(args)
