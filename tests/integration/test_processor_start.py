"""A processor refuses to start on topics it cannot use, with the command that fixes it:
none created yet, another partition count than its settings, or a user topic to publish
to or trigger from that does not exist (the engine never creates those)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from engine.adapters.kafka.admin import apply
from engine.config.settings import load_settings
from engine.config.topics import load_spec

pytestmark = pytest.mark.kafka


def _run_processor(
    bootstrap: str, namespace: str, partitions: int, *flags: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env["ENGINE_BOOTSTRAP_SERVERS"] = bootstrap
    command = [
        sys.executable, "-m", "engine", "run", "processor", "--module", "engine.examples.orders",
        "--namespace", namespace, "--partitions", str(partitions), "--state-dir", os.devnull,
        *flags,
    ]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def test_no_topics_yet(kafka_bootstrap: str) -> None:
    namespace = f"none-{uuid.uuid4().hex[:8]}"
    result = _run_processor(kafka_bootstrap, namespace, 2)
    assert result.returncode == 1, result.stderr
    assert f"turnstile topics apply --namespace {namespace} --partitions 2" in result.stderr
    assert "Traceback" not in result.stderr


def test_another_partition_count(kafka_bootstrap: str) -> None:
    namespace = f"drift-{uuid.uuid4().hex[:8]}"
    settings = load_settings(
        bootstrap_servers=kafka_bootstrap, namespace=namespace, partitions=2, env={}
    )
    apply(load_spec(), settings)
    result = _run_processor(kafka_bootstrap, namespace, 3)
    assert result.returncode == 1, result.stderr
    assert "has 2 partitions, the settings ask for 3" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_publish_or_trigger_topic(kafka_bootstrap: str) -> None:
    namespace = f"user-{uuid.uuid4().hex[:8]}"
    settings = load_settings(
        bootstrap_servers=kafka_bootstrap, namespace=namespace, partitions=2, env={}
    )
    apply(load_spec(), settings)
    flags = ("--publish-topic", f"{namespace}-shipmnets", "--trigger", f"{namespace}-x:orders.ship")
    result = _run_processor(kafka_bootstrap, namespace, 2, *flags)
    assert result.returncode == 1, result.stderr
    assert f"{namespace}-shipmnets" in result.stderr and "never creates" in result.stderr
    assert "Traceback" not in result.stderr
