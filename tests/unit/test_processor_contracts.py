"""A processor whose Avro schemas are missing, broken or incompatible with the engine refuses
to start, before it connects to Kafka or joins its group, with one line naming the file or
the record (no broker is needed: the address is a closed local port, which it never gets
to)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from engine.codec.registry import schema_dir


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def _schemas_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "schemas"
    shutil.copytree(schema_dir(), copy)
    return copy


def _run_processor(schemas: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNSTILE_", "ENGINE_"))}
    env |= {"TURNSTILE_SCHEMA_DIR": str(schemas), "ENGINE_BOOTSTRAP_SERVERS": _closed_port()}
    command = [
        sys.executable, "-m", "engine", "run", "processor", "--module", "engine.examples.orders",
        "--connect-timeout", "1", "--state-dir", os.devnull,
    ]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda path: path.unlink(), ["is missing", "TURNSTILE_SCHEMA_DIR"]),
        (lambda path: path.write_text("{not json", encoding="utf-8"), ["is not valid JSON"]),
        (lambda path: path.write_text('{"type": "record"}', encoding="utf-8"), ["not a valid"]),
    ],
    ids=["missing", "not-json", "not-a-schema"],
)
def test_a_processor_with_a_missing_or_broken_schema_refuses_to_start(
    tmp_path: Path, damage: object, words: list[str]
) -> None:
    schemas = _schemas_copy(tmp_path)
    target = schemas / "HistoryEvent.avsc"
    assert callable(damage)
    damage(target)
    _assert_refused(_run_processor(schemas), str(target), *words)


def test_a_processor_with_a_schema_that_does_not_match_the_engine_refuses_to_start(
    tmp_path: Path,
) -> None:
    """A valid schema that lost a field the engine writes (an edited or stale file)."""
    schemas = _schemas_copy(tmp_path)
    path = schemas / "ActivityTask.avsc"
    task = json.loads(path.read_text(encoding="utf-8"))
    task["fields"] = [f for f in task["fields"] if f["name"] != "task_queue"]
    path.write_text(json.dumps(task), encoding="utf-8")
    result = _run_processor(schemas)
    _assert_refused(result, "io.turnstile.ActivityTask", "does not mirror its class", "task_queue")


def test_a_row_schema_reads_the_command_union_from_its_file(tmp_path: Path) -> None:
    """InstanceRow.avsc refers to io.turnstile.Command instead of copying it: a Command.avsc
    that lost its body breaks the row schema too, and the processor says which file."""
    schemas = _schemas_copy(tmp_path)
    path = schemas / "Command.avsc"
    command = json.loads(path.read_text(encoding="utf-8"))
    command["fields"] = [f for f in command["fields"] if f["name"] != "body"]
    path.write_text(json.dumps(command), encoding="utf-8")
    result = _run_processor(schemas)
    _assert_refused(result, "InstanceRow.avsc is not a valid schema", "io.turnstile.Payload")


def _assert_refused(result: subprocess.CompletedProcess[str], *words: str) -> None:
    # 1, not 69: it stopped on its schemas, before it tried to reach Kafka
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for word in words:
        assert word in errors[0], errors[0]
