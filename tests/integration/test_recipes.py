"""The producer recipes of ``schemas/README.md`` work as shipped: each program in
``schemas/recipes/`` (Java, Go, kcat, Python without the engine) reads ``schemas/Command.avsc``,
starts a workflow and raises its event on the real broker, and the engine runs the workflow
to completion, answering both commands.

The programs are built and run as a user would (``mvn package``, ``go build``, the kcat
script with Apache Avro's avro-tools jar), once per test session. A recipe whose tool is not
installed is skipped with what to install; under CI (``CI`` set) it fails instead, since
``.ci/setup`` installs every tool. Each instance id is chosen so that Kafka's murmur2 and
librdkafka's default hash (CRC32) put it on different partitions: a recipe that forgot the
murmur2 partitioner is caught by where its records land, not by luck.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from engine_harness import REPO_ROOT, RunningEngine, running_engine

from engine.client import InstanceState
from engine.codec import decode_message
from engine.core.errors import WaitTimeoutError
from engine.core.history import RuntimeStatus
from engine.core.keys import partition_for_instance
from engine.core.messages import CommandOutcome, CommandResult

pytestmark = pytest.mark.kafka

RECIPES = REPO_ROOT / "schemas" / "recipes"
PARTITIONS = 8
BUILD_TIMEOUT = 1200  # a first Maven or Go build downloads its dependencies
RUN_TIMEOUT = 300
COMPLETION_TIMEOUT = 120
M2 = Path.home() / ".m2" / "repository"
AVRO_TOOLS_GLOB = "org/apache/avro/avro-tools/*/avro-tools-*.jar"
#: Where Go's installer puts it, which a non-login shell's PATH may lack.
STANDARD_PLACES = Path("/usr/local/go/bin")


@dataclass(frozen=True)
class Recipe:
    """How to run one recipe: ``argv`` is the program, to which the test appends
    ``start|raise BOOTSTRAP TOPIC INSTANCE_ID NAME JSON``."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def send(self, *args: str) -> str:
        """Run the program from the repository root (it reads schemas/Command.avsc there)
        and return the request id it printed."""
        done = subprocess.run(
            [*self.argv, *args],
            cwd=REPO_ROOT,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
        assert done.returncode == 0, f"{self.argv} failed:\n{done.stdout}\n{done.stderr}"
        found = re.search(r"request_id=(\S+)", done.stdout)
        assert found, f"{self.argv} printed no request id:\n{done.stdout}\n{done.stderr}"
        return found.group(1)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (.ci/setup installs it; CI runs every recipe)")
    pytest.skip(reason)


def _need(tool: str, install: str) -> str:
    path = shutil.which(tool) or shutil.which(tool, path=str(STANDARD_PLACES))
    if path is None:
        _unavailable(f"{tool} is not installed: {install}")
    assert path is not None
    return path


def _build(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}"


def _java(out: Path) -> Recipe:
    java = _need("java", "a JDK 17 or later (apt-get install openjdk-17-jdk-headless)")
    mvn = _need("mvn", "Apache Maven (apt-get install maven)")
    project = out / "java"
    shutil.copytree(RECIPES / "java", project)  # the build's target/ stays out of the repo
    _build([mvn, "-q", "-B", "package"], project)
    return Recipe((java, "-jar", str(project / "target" / "send-command.jar")))


def _go(out: Path) -> Recipe:
    go = _need("go", "Go 1.26 or later (https://go.dev/dl)")
    binary = out / "send-command"
    _build([go, "build", "-buildvcs=false", "-o", str(binary), "."], RECIPES / "go")
    return Recipe((str(binary),))


def _kcat(out: Path) -> Recipe:
    _need("kcat", "kcat (apt-get install kcat)")
    _need("java", "a JDK 17 or later, for avro-tools (apt-get install openjdk-17-jdk-headless)")
    jars = sorted(M2.glob(AVRO_TOOLS_GLOB))
    jar = os.environ.get("AVRO_TOOLS") or (str(jars[-1]) if jars else "")
    if not jar:
        _unavailable(
            "the avro-tools jar is missing: run bash .ci/setup, which fetches it with mvn "
            "dependency:get -Dartifact=org.apache.avro:avro-tools:1.12.2 (or set AVRO_TOOLS)"
        )
    return Recipe(("bash", str(RECIPES / "kcat" / "send-command.sh")), {"AVRO_TOOLS": jar})


def _python(out: Path) -> Recipe:
    return Recipe((sys.executable, str(RECIPES / "python" / "send_command.py")))


BUILDERS: dict[str, Callable[[Path], Recipe]] = {
    "java": _java,
    "go": _go,
    "kcat": _kcat,
    "python": _python,
}


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Recipe]:
    """Each recipe built at most once per session, on first use."""
    cache: dict[str, Recipe] = {}

    def get(name: str) -> Recipe:
        if name not in cache:
            cache[name] = BUILDERS[name](tmp_path_factory.mktemp(f"recipe-{name}"))
        return cache[name]

    return get


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    """A processor and a worker with the example workflows (orders.order among them)."""
    with running_engine(kafka_bootstrap, partitions=PARTITIONS) as running:
        yield running


def _instance_id(recipe: str) -> str:
    """An id whose murmur2 partition differs from the one librdkafka's default hashes it to."""
    while True:
        candidate = f"{recipe}-order-{uuid.uuid4().hex[:8]}"
        murmur2 = partition_for_instance(candidate, PARTITIONS)
        if murmur2 != zlib.crc32(candidate.encode()) % PARTITIONS:
            return candidate


def _completion(engine: RunningEngine, instance_id: str) -> InstanceState:
    """The instance's end; a record of it in dead letters (an unknown schema fingerprint, a
    record that does not decode) fails at once with the engine's reason."""
    for _ in range(COMPLETION_TIMEOUT):
        refused = [r for r in engine.dead_letters() if r.key == instance_id.encode()]
        assert not refused, f"the engine refused a record: {refused[0].headers}"
        try:
            return engine.client.wait_for_completion(instance_id, 1.0)
        except WaitTimeoutError:
            continue
    raise AssertionError(f"{instance_id} did not complete within {COMPLETION_TIMEOUT}s")


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_recipe_starts_a_workflow_and_raises_its_event(
    engine: RunningEngine, built: Callable[[str], Recipe], name: str
) -> None:
    recipe = built(name)
    instance_id = _instance_id(name)
    order = {"order_id": instance_id, "amount": 42, "approval_timeout_s": 600}
    common = (engine.bootstrap, engine.topics.commands, instance_id)
    started = recipe.send("start", *common, "orders.order", json.dumps(order))
    raised = recipe.send("raise", *common, "approval", json.dumps({"approved": True}))

    state = _completion(engine, instance_id)
    assert state.status is RuntimeStatus.COMPLETED, state.failure
    assert state.output["status"] == "shipped"
    assert state.output["charge"] == {"charge_id": f"ch-{instance_id}", "amount": 42}

    key = instance_id.encode()
    commands = [r for r in engine.read(engine.topics.commands) if r.key == key]
    assert [r.partition for r in commands] == [partition_for_instance(instance_id, PARTITIONS)] * 2
    outcomes = [
        decode_message(r.value)
        for r in engine.read(engine.topics.command_outcomes)
        if r.key == key and r.value is not None
    ]
    answered = [
        (o.request_id, o.command, o.result) for o in outcomes if isinstance(o, CommandOutcome)
    ]
    assert answered[0] == (started, "StartWorkflow", CommandResult.ACCEPTED)
    assert answered[1][:2] == (raised, "RaiseEvent")
    assert answered[1][2] in (CommandResult.ACCEPTED, CommandResult.BUFFERED)
    assert not [r for r in engine.dead_letters() if r.key == key], "a record was refused"
