"""Bad input to commands that first reach the broker is a message too, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.kafka


def test_export_into_a_missing_folder(kafka_bootstrap: str, tmp_path: Path) -> None:
    from engine.adapters.kafka.admin import apply
    from engine.config.settings import load_settings
    from engine.config.topics import load_spec

    settings = load_settings(bootstrap_servers=kafka_bootstrap, namespace="cli-errors", env={})
    apply(load_spec(), settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env["ENGINE_BOOTSTRAP_SERVERS"] = kafka_bootstrap
    target = tmp_path / "missing" / "out.avro"
    result = subprocess.run(
        [sys.executable, "-m", "engine", "history", "export", "-o", str(target),
         "--namespace", "cli-errors", "--quiet"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert f"cannot write {target}" in result.stderr and "Traceback" not in result.stderr
