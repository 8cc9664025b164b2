"""The local broker keeps its address across a stop and start, ``--fresh`` included, so an
exported ENGINE_BOOTSTRAP_SERVERS stays right."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.dev.local_kafka import LocalKafka

pytestmark = pytest.mark.kafka


def test_restart_and_fresh_start_keep_the_port(tmp_path: Path) -> None:
    broker = LocalKafka(tmp_path / "broker", progress=lambda _message: None)
    try:
        first = broker.start(timeout=120.0)
        broker.stop()
        assert broker.start(timeout=120.0) == first
        broker.stop()
        assert broker.start(timeout=120.0, fresh=True) == first
    finally:
        broker.stop()
