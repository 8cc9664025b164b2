"""Schedules and retention on the real broker, through the CLI: create a schedule that
fires every second, see a few fire times run (each run started once), pause it, describe and
list it, refuse a duplicate, delete it; and a workflow whose finished instances the
processor purges after their retention."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from engine.core.history import ExecutionCompleted, ExecutionStarted, RuntimeStatus
from tests.engine_harness import RunningEngine, running_engine, wait_until

pytestmark = pytest.mark.kafka

MODULES = ["tests.schedule_workflows"]


def _cli(engine: RunningEngine, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    common = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace]
    return subprocess.run(
        [sys.executable, "-m", "engine", "schedule", *args, *common],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def _runs(engine: RunningEngine) -> dict[str, Any]:
    return {
        s.instance_id: s
        for s in engine.client.list_instances(name="sched.tick")
        if s.instance_id.startswith("tick/")
    }


def test_a_schedule_from_the_cli(kafka_bootstrap: str) -> None:
    with running_engine(kafka_bootstrap, workers=0, modules=MODULES) as engine:
        created = _ok(_cli(engine, "create", "tick", "--every", "1s", "--workflow", "sched.tick",
                           "--input", '"cli"', "--overlap", "SKIP"))  # fmt: skip
        assert created.startswith("ACCEPTED: next fire time at")
        again = _cli(engine, "create", "tick", "--every", "5s", "--workflow", "sched.tick")
        assert again.returncode == 4 and "exists already" in again.stderr, again.stderr

        def three_completed() -> bool:
            done = [s for s in _runs(engine).values() if s.status is RuntimeStatus.COMPLETED]
            return len(done) >= 3

        wait_until(three_completed, timeout=60, what="three fire times to run")
        assert _ok(_cli(engine, "pause", "tick", "--reason", "enough")).startswith("ACCEPTED")
        described = json.loads(_ok(_cli(engine, "describe", "tick")))
        assert described["state"] == "PAUSED" and described["note"] == "enough"
        assert described["input"] == "cli" and described["every_ms"] == 1000
        wait_until(
            lambda: all(s.is_completed for s in _runs(engine).values()),
            timeout=30,
            what="the started runs to end",
        )
        runs = _runs(engine)
        assert len(runs) == described["started"]
        histories = engine.histories()
        for run_id, state in runs.items():
            assert state.output == "tick cli"
            starts = [e for e in histories[run_id] if isinstance(e.body, ExecutionStarted)]
            assert len(starts) == 1, run_id  # each fire time started exactly one run
        listed = _ok(_cli(engine, "list"))
        assert "tick" in listed and "PAUSED" in listed
        assert _ok(_cli(engine, "delete", "tick")).startswith("ACCEPTED: deleted")
        gone = _cli(engine, "describe", "tick")
        assert gone.returncode == 1 and "no schedule 'tick'" in gone.stdout
        unknown = _cli(engine, "trigger", "tick")
        assert unknown.returncode == 4 and "no schedule 'tick'" in unknown.stderr


def test_retention_purges_finished_instances(kafka_bootstrap: str) -> None:
    with running_engine(kafka_bootstrap, workers=0, modules=MODULES) as engine:
        client = engine.client
        client.start("sched.brief", 7, instance_id="brief-1")
        assert engine.wait_for_completion("brief-1").output == 7
        wait_until(lambda: client.get("brief-1") is None, timeout=60, what="the purge")
        history = engine.history("brief-1")  # the history topic keeps its events
        assert any(isinstance(e.body, ExecutionCompleted) for e in history)


def test_a_schedule_whose_run_parks_pauses_itself(kafka_bootstrap: str) -> None:
    """A typo in the workflow name parks the first run on its partition; the run tells the
    schedule's row (a PARKED child result over instance-messages), which pauses and says
    why, instead of skipping every later fire time behind a run that never ends."""
    with running_engine(kafka_bootstrap, workers=0, modules=MODULES) as engine:
        _ok(_cli(engine, "create", "typo", "--every", "1s", "--workflow", "sched.tikc"))

        def paused() -> dict[str, Any] | None:
            described: dict[str, Any] = json.loads(_ok(_cli(engine, "describe", "typo")))
            return described if described["state"] == "PAUSED" else None

        described = wait_until(paused, timeout=60, what="the schedule to pause itself")
        assert "NotRegisteredError" in described["note"] and "PARKED" in described["note"]
        assert described["started"] == 1 and described["next_fire"] == "-"
        (run,) = described["running"]
        state = engine.client.get(run)
        assert state is not None and state.status is RuntimeStatus.PARKED
        assert "PAUSED" in _ok(_cli(engine, "list"))
        assert _ok(_cli(engine, "resume", "typo")).startswith("ACCEPTED: resumed")
