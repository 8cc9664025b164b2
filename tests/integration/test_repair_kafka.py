"""Reset, rerun and bulk operations from the CLI on a real broker.

One engine (processor and worker as threads of the test process) serves the module; the
bulk job runs as its own process, is killed once its position is saved, and resumes.
Waits are bounded guards against hanging, never performance assertions.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_harness import RunningEngine, running_engine, wait_until

from engine.cli.main import EXIT_REFUSED, main
from engine.core.history import ExecutionReset, ExecutionTerminated, RuntimeStatus

pytestmark = pytest.mark.kafka

WAIT = 60.0
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    with running_engine(kafka_bootstrap, partitions=2) as running:
        yield running


def _flags(engine: RunningEngine) -> list[str]:
    return ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace]


def test_reset_and_rerun_from_the_cli(
    engine: RunningEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    client = engine.client
    instance = f"r-{uuid.uuid4().hex[:10]}"
    client.start("t.wait_event", None, instance_id=instance)
    client.raise_event(instance, "go", {"n": 1})
    assert client.wait_for_completion(instance, WAIT).output["got"] == {"n": 1}
    capsys.readouterr()
    reset = ["reset", instance, "--to-first-turn", "--reason", "run it again"]
    assert main([*reset, *_flags(engine)]) == 0
    assert capsys.readouterr().out.startswith(f"ACCEPTED {instance}: generation 1 runs from")
    again = client.wait_for_completion(instance, WAIT, generation=1)
    assert (again.generation, again.output["got"]) == (1, {"n": 1})  # the event came again
    markers = [e.body for e in engine.history(instance) if isinstance(e.body, ExecutionReset)]
    assert [m.reason for m in markers] == ["run it again"]
    # a point past the end is refused with the reason, and nothing changes
    assert main(["reset", instance, "--to", "9999", "--reason", "x", *_flags(engine)]) == (
        EXIT_REFUSED
    )
    assert "past the end" in capsys.readouterr().err
    copy = f"{instance}-copy"
    assert main(["rerun", instance, "--new-id", copy, *_flags(engine)]) == 0
    assert capsys.readouterr().out.startswith(f"ACCEPTED {copy}")
    assert client.wait_for_completion(copy, WAIT).output["got"] == {"n": 1}
    assert client.get(instance).generation == 1  # type: ignore[union-attr]


def test_a_bulk_terminate_killed_midway_resumes_and_applies_each_command_once(
    engine: RunningEngine, tmp_path: Path
) -> None:
    client = engine.client
    prefix = f"b-{uuid.uuid4().hex[:8]}"
    ids = [f"{prefix}-{i:02d}" for i in range(20)]
    for instance_id in ids:
        client.start("t.wait_event", None, instance_id=instance_id)
    wait_until(
        lambda: all(
            (s := client.get(i)) is not None and s.status is RuntimeStatus.RUNNING for i in ids
        ),
        WAIT,
        what="the instances to run",
    )
    state = tmp_path / "jobs"
    argv = [
        sys.executable, "-m", "engine", "bulk", "terminate", "--status", "RUNNING",
        "--reason", "cleanup", "--rate", "4/s", "--job-id", "cleanup", "--state-dir",
        str(state), *_flags(engine),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    position = state / "cleanup.json"
    first = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE)
    try:
        wait_until(position.exists, WAIT, 0.02, "the job to save its position")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(WAIT)
    handled = json.loads(position.read_text())["sent"]
    assert 0 < handled < len(ids), "the job was killed after it finished; slow the rate"
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "timed out 0" in done.stdout and "refused" not in done.stdout
    assert "bulk terminate cleanup:" in done.stderr  # progress
    wait_until(
        lambda: all(client.get(i).status is RuntimeStatus.TERMINATED for i in ids),  # type: ignore[union-attr]
        WAIT,
        what="every instance to be terminated",
    )
    for instance_id in ids:
        ends = [e for e in engine.history(instance_id) if isinstance(e.body, ExecutionTerminated)]
        assert len(ends) == 1, instance_id
