"""Task queues: names, registration, routing to one topic per queue, and the status note of
a task no worker serves (the Kafka side: tests/integration/test_task_queues_kafka.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import Registry, WorkflowContext
from engine.cli import worker_cmd
from engine.cli.topics import declared_spec
from engine.codec import decode_message, encode_message
from engine.config.topics import load_spec, topic_names, with_task_queues
from engine.core.errors import ConfigurationError
from engine.core.messages import ActivityResult, ActivityTask
from engine.core.payloads import to_payload
from engine.core.task_queues import DEFAULT_TASK_QUEUE, check_task_queue
from engine.testing import TestEngine

registry = Registry()


@registry.activity(name="render", task_queue="gpu")
def render(x: int) -> int:
    return x * 10


@registry.activity(name="mail")
def mail(x: int) -> int:
    return x + 1


@registry.workflow(name="both")
async def both(ctx: WorkflowContext, x: int) -> list[int]:
    a = await ctx.call_activity(render, x)
    b = await ctx.call_activity("mail", x)
    c = await ctx.call_activity("mail", x, task_queue="mail-eu")
    return [a, b, c]


@registry.workflow(name="bad-queue")
async def bad_queue(ctx: WorkflowContext, x: int) -> int:
    return int(await ctx.call_activity("mail", x, task_queue="no spaces"))


def test_registration_and_calls_choose_the_queue() -> None:
    assert registry.activity_task_queue(render) == "gpu"
    assert registry.activity_task_queue("render") == "gpu"
    assert registry.activity_task_queue(mail) == DEFAULT_TASK_QUEUE
    assert registry.activity_task_queue("unknown") == DEFAULT_TASK_QUEUE
    assert registry.task_queues() == ["default", "gpu"]


def test_each_queue_is_its_own_topic_and_the_workflow_completes() -> None:
    with TestEngine(registry) as env:
        env.start("both", 2, instance_id="i")
        assert env.wait_for_completion("i").output == [20, 3, 3]
        by_topic = {
            t: [decode_message(r.value) for r in env.records(t) if r.value]
            for t in ("activity-tasks.gpu", "activity-tasks", "activity-tasks.mail-eu")
        }
    assert [(t.name, t.task_queue) for t in by_topic["activity-tasks.gpu"]] == [("render", "gpu")]
    assert [t.task_queue for t in by_topic["activity-tasks"]] == ["default"]
    assert [t.task_queue for t in by_topic["activity-tasks.mail-eu"]] == ["mail-eu"]


def test_a_bad_queue_name_fails_the_workflow_with_advice() -> None:
    with TestEngine(registry) as env:
        env.start("bad-queue", 1, instance_id="b")
        status = env.wait_for_completion("b")
    assert status.failure is not None and "task queue 'no spaces'" in status.failure.message


def test_a_registration_with_a_bad_queue_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="not a valid name"):
        Registry().add_activity(mail, name="m", task_queue="a/b")


@given(st.text(max_size=120))
def test_valid_queue_names_make_valid_topic_names(name: str) -> None:
    try:
        check_task_queue(name)
    except ConfigurationError:
        return
    topic = topic_names("ns").task_queue(name)
    assert len(topic) <= 249 and all(c.isalnum() or c in "._-" for c in topic)
    assert topic_names("ns").is_task_queue(topic)


def test_queue_topics_are_declared_like_activity_tasks() -> None:
    spec = with_task_queues(load_spec(), ["gpu", "default", "gpu"])
    base, gpu = spec.topic("activity-tasks"), spec.topic("activity-tasks.gpu")
    assert gpu.config == base.config and gpu.partitions == base.partitions
    assert [t.name for t in spec.topics].count("activity-tasks.gpu") == 1
    assert topic_names("ns").task_queue("default") == "ns.activity-tasks"


def test_topics_apply_declares_the_queues_a_module_registers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tq_fleet_activities.py").write_text(
        "from engine import activity\n\n"
        "@activity(name='tq-fleet.train', task_queue='ml-train')\n"
        "def train(x: int) -> int:\n"
        "    return x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = declared_spec(None, ["gpu"], ["tq_fleet_activities"])
    names = {t.name for t in spec.topics}
    assert {"activity-tasks", "activity-tasks.gpu", "activity-tasks.ml-train"} <= names
    assert "activity-tasks.ml-train" not in {t.name for t in declared_spec(None, [], []).topics}
    with pytest.raises(ConfigurationError, match="cannot import module 'tq_fleet_missing'"):
        declared_spec(None, [], ["tq_fleet_missing"])


def test_run_worker_consumes_each_named_queue_once_else_the_registered_ones() -> None:
    parser = argparse.ArgumentParser(prog="turnstile")
    worker_cmd.register(parser.add_subparsers())
    named = ["run", "worker", "--task-queue", "gpu", "--task-queue", "mail", "--task-queue", "gpu"]
    flags = parser.parse_args(named).task_queues
    assert worker_cmd.served_queues(flags, ["default"]) == ["gpu", "mail"]
    unnamed = parser.parse_args(["run", "worker"]).task_queues
    assert worker_cmd.served_queues(unnamed, registry.task_queues()) == ["default", "gpu"]
    with pytest.raises(ConfigurationError):
        worker_cmd.served_queues(["no spaces"], [])


@registry.workflow(name="absent")
async def absent(ctx: WorkflowContext, x: int) -> int:
    return int(await ctx.call_activity("nowhere", x, task_queue="gpu"))


def test_an_unserved_task_is_noted_in_the_status_until_a_result_arrives() -> None:
    with TestEngine(registry) as env:
        env.start("absent", 2, instance_id="u")
        env.run()
        status = env.client.get("u")
        assert status.status.value == "RUNNING"  # never failed: it waits for a worker
        assert "'nowhere'" in status.unserved and "--task-queue gpu" in status.unserved
        (task,) = [decode_message(r.value) for r in env.records("activity-tasks.gpu") if r.value]
        assert isinstance(task, ActivityTask)
        done = ActivityResult("u", 0, task.task_id, task.attempt, output=to_payload(7))
        env.produce(env.topics.activity_results, b"u", encode_message(done))
        final = env.wait_for_completion("u")
    assert final.output == 7 and final.unserved == ""
