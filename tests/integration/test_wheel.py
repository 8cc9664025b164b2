"""The built wheel works on its own: installed into a clean virtualenv in an empty folder
(no source tree anywhere near), it runs the demo, creates topics, and runs a workflow from a
user module through ``run all``, ``start`` and ``wait``, without one raw librdkafka line.

This is what a new user does first; the rest of the suite runs from the checkout, where the
schemas and the topics spec sit next to the package and would hide a wheel that lacks them.
pip's cache makes the clean install take seconds.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import engine

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
#: A librdkafka log line as it prints when nobody routes its logs: "%4|1712345678.123|FAC|".
RAW_LIBRDKAFKA = re.compile(r"^%\d\|\d+\.\d+\|", re.MULTILINE)
COMMAND_TIMEOUT = 300

USER_MODULE = """
from engine import WorkflowContext, activity, workflow


@activity(name="greet.hello")
def hello(name: str) -> str:
    return f"hello {name}"


@workflow(name="greet")
async def greet(ctx: WorkflowContext, name: str) -> str:
    return await ctx.call_activity(hello, name)
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with only the freshly built wheel (and its dependencies) installed."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)])
    wheels = list(dist.glob("turnstile_engine-*.whl"))
    assert len(wheels) == 1, f"expected one wheel, built {wheels}"
    _check_contents(wheels[0])
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheels[0])])
    return venv / "bin"


def _check_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for wanted in (
        "engine/py.typed",
        "engine/_contracts/schemas/HistoryEvent.avsc",
        "engine/_contracts/schemas/released/1/Command.avsc",
        "engine/_contracts/topics/topics.toml",
        "engine/services/processor/partition.py",
        f"turnstile_engine-{engine.__version__}.dist-info/licenses/LICENSE",
    ):
        assert wanted in names, f"the wheel lacks {wanted}"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An empty folder outside the checkout: the user's project."""
    folder = tmp_path / "project"
    folder.mkdir()
    return folder


def _env(bootstrap: str, state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNSTILE_", "PYTHON"))}
    env.update({"ENGINE_BOOTSTRAP_SERVERS": bootstrap, "TURNSTILE_STATE_DIR": str(state)})
    return env


def _run(
    command: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, (
        f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )
    assert not RAW_LIBRDKAFKA.search(result.stderr), f"raw librdkafka output:\n{result.stderr}"
    return result


def test_version(installed: Path, workdir: Path) -> None:
    shown = _run([str(installed / "turnstile"), "--version"], cwd=workdir).stdout
    assert shown.strip() == f"turnstile {engine.__version__}"


def test_demo_runs_from_the_wheel(
    installed: Path, workdir: Path, kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = _env(kafka_bootstrap, tmp_path / "state")
    out = _run([str(installed / "turnstile"), "demo"], cwd=workdir, env=env).stdout
    assert re.search(r"order-A-\w+: COMPLETED -> .*'status': 'shipped'", out), out
    assert re.search(r"order-B-\w+: COMPLETED -> .*'status': 'refunded'", out), out


@pytest.fixture
def engine_from_wheel(
    installed: Path, workdir: Path, kafka_bootstrap: str, tmp_path: Path
) -> Iterator[tuple[Path, dict[str, str]]]:
    """``run all`` of the installed engine on a user module in ``workdir``, in a new
    namespace whose topics ``topics apply`` created."""
    (workdir / "greet.py").write_text(textwrap.dedent(USER_MODULE))
    env = _env(kafka_bootstrap, tmp_path / "state")
    env["TURNSTILE_NAMESPACE"] = f"wheel-{uuid.uuid4().hex[:8]}"
    env["TURNSTILE_PARTITIONS"] = "2"
    _run([str(installed / "turnstile"), "topics", "apply"], cwd=workdir, env=env)
    log = (tmp_path / "run-all.log").open("w+")
    process = subprocess.Popen(
        [str(installed / "turnstile"), "run", "all", "--module", "greet"],
        cwd=workdir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield workdir, env
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.seek(0)
        output = log.read()
        log.close()
    assert process.returncode == 0, f"run all exited {process.returncode}:\n{output}"
    assert not RAW_LIBRDKAFKA.search(output), f"raw librdkafka output:\n{output}"


def test_start_and_wait_from_the_wheel(
    installed: Path, engine_from_wheel: tuple[Path, dict[str, str]]
) -> None:
    workdir, env = engine_from_wheel
    turnstile = str(installed / "turnstile")
    started = _run([turnstile, "start", "greet", "--input", '"wheel"'], cwd=workdir, env=env)
    instance_id = started.stdout.strip()
    waited = _run(
        [turnstile, "wait", instance_id, "--timeout", "120", "--json"], cwd=workdir, env=env
    )
    assert '"output": "hello wheel"' in waited.stdout, waited.stdout
    assert '"status": "COMPLETED"' in waited.stdout, waited.stdout
