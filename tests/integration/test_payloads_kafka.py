"""The codec chain on the real broker: processor and worker subprocesses and the client all
take it from their settings, the history on Kafka holds only compressed, encrypted
payloads, and the `history show` command reads them back with the key."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from engine.config.payloads import install_payload_codecs
from engine.config.settings import Settings
from engine.core.history import ExecutionCompleted, ExecutionStarted, TaskCompleted, TaskScheduled
from engine.core.payload_codecs import split_encoding
from engine.core.payloads import Payload, from_payload
from tests.engine_harness import REPO_ROOT, EngineProcess, RunningEngine, running_engine

pytestmark = pytest.mark.kafka

KEYS = f"k1:{base64.b64encode(b'k' * 32).decode()}"
CHAIN = ("zstd", "aes-gcm")
SECRET = "top secret " * 200


@pytest.fixture
def chain_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The chain for the engine's subprocesses (they inherit the environment)."""
    monkeypatch.setenv("TURNSTILE_PAYLOAD_CODECS", ",".join(CHAIN))
    monkeypatch.setenv("TURNSTILE_PAYLOAD_KEYS", KEYS)
    yield
    install_payload_codecs(Settings())


def test_every_process_applies_the_chain_and_the_history_is_encrypted(
    kafka_bootstrap: str, chain_env: None
) -> None:
    changes = {"payload_codecs": CHAIN, "payload_keys": KEYS}
    with running_engine(kafka_bootstrap, in_process=False, settings_changes=changes) as engine:
        run = engine.client.start("t.upper_and_child", SECRET)
        done = engine.client.wait_for_completion(run, timeout=120)
        events = engine.history(run)
        where = ["--bootstrap-servers", kafka_bootstrap, "--namespace", engine.settings.namespace]
        shown = subprocess.run(
            [sys.executable, "-m", "engine", "history", "show", run, *where],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.output == {"shouted": SECRET.upper(), "child": SECRET}
    payloads = [_payload_of(e.body) for e in events if isinstance(e.body, CARRYING)]
    assert len(payloads) == 4  # the start, the activity's input and result, the output
    for payload in payloads:
        assert payload is not None and split_encoding(payload.encoding)[1] == CHAIN
        assert b"secret" not in payload.data.lower()
    assert from_payload(payloads[0]) == SECRET
    assert shown.returncode == 0, shown.stderr
    assert '"TOP SECRET TOP SECRET' in shown.stdout  # the audit command has the key


CARRYING = (ExecutionStarted, TaskScheduled, TaskCompleted, ExecutionCompleted)


def _payload_of(body: object) -> Payload | None:
    return body.output if isinstance(body, TaskCompleted | ExecutionCompleted) else body.input  # type: ignore[attr-defined]


def test_a_killed_processor_and_worker_come_back_with_a_new_key_and_lose_nothing(
    kafka_bootstrap: str, chain_env: None
) -> None:
    """SIGKILL both mid-run, restart them with a rotated key set: every instance replays
    its history (written with the old key) from a cold cache, takes its event (written
    with the new one) and completes; one history then holds payloads of both keys."""
    rotated = f"{KEYS},k2:{base64.b64encode(b'n' * 32).decode()}"
    changes = {"payload_codecs": CHAIN, "payload_keys": KEYS}
    with running_engine(kafka_bootstrap, in_process=False, settings_changes=changes) as engine:
        runs = [engine.client.start("t.upper_then_wait", f"{SECRET}{n}") for n in range(20)]
        (processor,) = engine.processors.values()
        (worker,) = engine.workers.values()
        assert isinstance(processor, EngineProcess) and isinstance(worker, EngineProcess)
        _wait_for_a_result(engine, runs[0])  # work is under way: kill in the middle of it
        processor.kill()
        worker.kill()
        for handle in (processor, worker):
            handle.env["TURNSTILE_PAYLOAD_KEYS"] = rotated
            handle.start()
        install_payload_codecs(replace(engine.settings, payload_keys=rotated))
        for n, run in enumerate(runs):
            engine.client.raise_event(run, "go", f"event {n}")
        states = [engine.client.wait_for_completion(run, timeout=180) for run in runs]
        histories = engine.histories()
    for n, state in enumerate(states):
        assert state.output == {"shouted": f"{SECRET}{n}".upper(), "got": f"event {n}"}
    keys_used = set()
    for run in runs:
        for event in histories[run]:
            payload = _payload_of(event.body) if isinstance(event.body, CARRYING) else None
            if payload is not None:
                keys_used.add(bytes(payload.data[2:4]))  # the aes-gcm layout: 1, len, key id
    assert keys_used == {b"k1", b"k2"}


def _wait_for_a_result(engine: RunningEngine, run: str) -> None:
    deadline = time.monotonic() + 120
    while not any(isinstance(e.body, TaskCompleted) for e in engine.history(run)):
        assert time.monotonic() < deadline, engine.logs()
        time.sleep(0.2)
