"""Bulk operations: the filter, the durable position, resuming, pacing and the summary, on
the test engine's client (the same client service the Kafka client wraps)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.core.errors import ConfigurationError
from engine.core.history import RuntimeStatus
from engine.core.messages import InstanceStatus
from engine.services.client.bulk import (
    BulkFilter,
    BulkJob,
    JobSpec,
    Position,
    PositionFile,
    request_id,
)
from engine.testing import TestEngine

registry = Registry()


@registry.workflow(name="idle")
async def idle(ctx: WorkflowContext, _: Any) -> str:
    return str(await ctx.wait_for_event("done"))


@registry.workflow(name="quick")
async def quick(ctx: WorkflowContext, _: Any) -> str:
    return "ok"


@pytest.fixture
def env() -> Iterator[TestEngine]:
    with TestEngine(registry, partitions=3) as engine:
        yield engine


def _statuses(env: TestEngine) -> list[InstanceStatus]:
    """Every status in instance-id order, as the CLI reads them back from its fold."""
    return sorted(env.client.list_instances(), key=lambda s: s.instance_id)


def _start(env: TestEngine, count: int, workflow: str = "idle") -> list[str]:
    ids = [f"{workflow}-{i}" for i in range(count)]
    for instance_id in ids:
        env.start(workflow, None, instance_id=instance_id)
    env.run()
    return ids


def _job(env: TestEngine, tmp_path: Path, spec: JobSpec, job_id: str = "j") -> BulkJob:
    return BulkJob(job_id, spec, env.client, PositionFile(tmp_path, job_id))


def test_terminate_every_running_instance_of_a_workflow(env: TestEngine, tmp_path: Path) -> None:
    ids = _start(env, 5)
    _start(env, 2, "quick")
    spec = JobSpec("terminate", BulkFilter((RuntimeStatus.RUNNING,), name="idle"), "cleanup")
    summary = _job(env, tmp_path, spec).run(_statuses(env), 30)
    assert (summary.matched, summary.sent, summary.applied, summary.timed_out) == (5, 5, 5, 0)
    env.run()
    assert {env.get(i).status for i in ids} == {RuntimeStatus.TERMINATED}  # type: ignore[union-attr]
    assert env.get("quick-0").status is RuntimeStatus.COMPLETED  # type: ignore[union-attr]


def test_cancel_every_running_instance_of_a_workflow(env: TestEngine, tmp_path: Path) -> None:
    ids = _start(env, 3)
    spec = JobSpec("cancel", BulkFilter((RuntimeStatus.RUNNING,), name="idle"), "wind down")
    summary = _job(env, tmp_path, spec).run(_statuses(env), 30)
    assert (summary.matched, summary.sent, summary.applied, summary.timed_out) == (3, 3, 3, 0)
    env.run()
    states = [env.get(i) for i in ids]
    assert {s.status for s in states if s is not None} == {RuntimeStatus.CANCELLED}
    assert {s.failure.message for s in states if s is not None and s.failure} == {"wind down"}


def test_a_job_resumes_after_its_saved_position(env: TestEngine, tmp_path: Path) -> None:
    ids = _start(env, 6)
    spec = JobSpec("suspend", BulkFilter((RuntimeStatus.RUNNING,)))
    PositionFile(tmp_path, "j").save(Position(spec, ids[2], 3, 7))  # died after the third
    summary = _job(env, tmp_path, spec).run(_statuses(env), 30)
    assert (summary.matched, summary.skipped, summary.sent) == (6, 3, 3)
    env.run()
    assert [env.get(i).status for i in ids] == (  # type: ignore[union-attr]
        [RuntimeStatus.RUNNING] * 3 + [RuntimeStatus.SUSPENDED] * 3
    )
    assert PositionFile(tmp_path, "j").load() == Position(spec, ids[-1], 6, 7)


def test_a_job_run_again_without_its_position_applies_nothing_twice(
    env: TestEngine, tmp_path: Path
) -> None:
    _start(env, 3)
    spec = JobSpec("terminate", BulkFilter((RuntimeStatus.RUNNING,)), "once")
    _job(env, tmp_path, spec).run(_statuses(env), 30)
    env.run()
    PositionFile(tmp_path, "j").path.unlink()  # the position was lost: every command again
    everything = JobSpec("terminate", BulkFilter(), "once")
    again = _job(env, tmp_path, everything).run(_statuses(env), 30)
    assert (again.sent, again.duplicates, again.applied) == (3, 3, 0)
    history = env.history("idle-0")
    assert len([e for e in history if type(e.body).__name__ == "ExecutionTerminated"]) == 1


def test_refusals_are_counted_by_error(env: TestEngine, tmp_path: Path) -> None:
    _start(env, 2)
    _start(env, 1, "quick")
    summary = _job(env, tmp_path, JobSpec("purge")).run(_statuses(env), 30)
    assert summary.applied == 1
    assert summary.refused == {"InstanceStillRunningError": 2}
    assert "refused 2: InstanceStillRunningError" in summary.lines()


def test_bulk_reset_to_the_first_turn(env: TestEngine, tmp_path: Path) -> None:
    _start(env, 2, "quick")
    spec = JobSpec("reset", BulkFilter((RuntimeStatus.COMPLETED,)), "again", "FIRST_TURN")
    summary = _job(env, tmp_path, spec).run(_statuses(env), 30)
    assert summary.applied == 2
    env.run()
    assert env.get("quick-1").generation == 1  # type: ignore[union-attr]


def test_a_resume_with_other_options_is_refused(env: TestEngine, tmp_path: Path) -> None:
    PositionFile(tmp_path, "j").save(Position(JobSpec("terminate"), "x", 1, 0))
    with pytest.raises(ConfigurationError, match="started with other options"):
        _job(env, tmp_path, JobSpec("suspend")).run([], 30)


def test_the_rate_paces_the_commands(env: TestEngine, tmp_path: Path) -> None:
    _start(env, 4)
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    job = BulkJob(
        "paced",
        JobSpec("suspend"),
        env.client,
        PositionFile(tmp_path, "paced"),
        rate=2.0,
        clock=lambda: now[0],
        sleep=sleep,
    )
    job.run(_statuses(env), 30)
    assert slept == [0.5, 0.5, 0.5]


def test_filters_on_version_and_times() -> None:
    def status(i: str, **fields: Any) -> InstanceStatus:
        return InstanceStatus(i, **fields)

    rows = [
        status(
            "a", version="1", created_ms=100, status=RuntimeStatus.COMPLETED, last_updated_ms=500
        ),
        status("b", version="2", created_ms=200, status=RuntimeStatus.RUNNING, last_updated_ms=300),
        status("c", version="2", created_ms=300, status=RuntimeStatus.FAILED, last_updated_ms=900),
    ]
    assert BulkFilter(version="2").matching(rows) == ["b", "c"]
    assert BulkFilter(created_before=250).matching(rows) == ["a", "b"]
    assert BulkFilter(created_after=150).matching(rows) == ["b", "c"]
    assert BulkFilter(ended_before=600).matching(rows) == ["a"]  # b has not ended
    assert BulkFilter(ended_after=600).matching(rows) == ["c"]


def test_request_ids_are_stable_per_job_and_instance() -> None:
    assert request_id("j", "x") == request_id("j", "x") != request_id("k", "x")


def test_a_job_id_must_name_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot name a file"):
        PositionFile(tmp_path, "../up")


def test_an_unknown_operation_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="unknown bulk operation"):
        JobSpec("explode")


def test_filters_on_tags_and_a_resume_keeps_them(tmp_path: Path) -> None:
    rows = [
        InstanceStatus("a", tags={"customer": "c-1", "tier": "gold"}),
        InstanceStatus("b", tags={"customer": "c-1"}),
        InstanceStatus("c", tags={"customer": "c-2", "tier": "gold"}),
    ]
    both = BulkFilter(tags=(("customer", "c-1"), ("tier", "gold")))
    assert both.matching(rows) == ["a"]
    assert BulkFilter(tags=(("tier", "gold"),)).matching(rows) == ["a", "c"]
    spec = JobSpec("terminate", both, "cleanup")
    PositionFile(tmp_path, "t").save(Position(spec, "a", 1, 0))
    saved = PositionFile(tmp_path, "t").load()
    assert saved is not None and saved.spec == spec


def test_a_job_holds_a_window_of_commands_not_the_matches(env: TestEngine, tmp_path: Path) -> None:
    ids = _start(env, 10)
    job = BulkJob("w", JobSpec("suspend"), env.client, PositionFile(tmp_path, "w"), window=3)
    pulled: list[int] = []

    def lazily() -> Iterator[InstanceStatus]:
        for index, status in enumerate(_statuses(env)):
            # the job answered all but a window's worth before it asks for the next status
            assert job.answered >= index - 3, (index, job.answered)
            pulled.append(index)
            yield status

    summary = job.run(lazily(), 30)
    assert (summary.matched, summary.sent, summary.applied, summary.timed_out) == (10, 10, 10, 0)
    assert job.held_peak == 3 and job.answered == 10 and len(pulled) == 10
    env.run()
    assert {env.get(i).status for i in ids} == {RuntimeStatus.SUSPENDED}  # type: ignore[union-attr]
    assert PositionFile(tmp_path, "w").load() == Position(JobSpec("suspend"), ids[-1], 10, 0)


def test_statuses_out_of_id_order_are_refused(env: TestEngine, tmp_path: Path) -> None:
    _start(env, 2)
    backwards = list(reversed(_statuses(env)))
    with pytest.raises(ConfigurationError, match="instance-id order"):
        _job(env, tmp_path, JobSpec("suspend")).run(backwards, 30)


def test_the_engines_own_rows_are_never_matched() -> None:
    rows = [InstanceStatus("a"), InstanceStatus("~schedules/nightly")]
    assert BulkFilter().matching(rows) == ["a"]
    assert list(BulkFilter().scan(rows)) == ["a"]
