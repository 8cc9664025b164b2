"""The engine processes raise the collector's thresholds (engine/cli/gc_tuning.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from engine.cli.gc_tuning import ENGINE_GC_THRESHOLDS, tune_gc


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.mark.usefixtures("thresholds")
def test_tune_gc_collects_young_objects_less_often_and_keeps_collecting() -> None:
    gc.set_threshold(700, 10, 10)
    tune_gc()
    assert gc.get_threshold() == ENGINE_GC_THRESHOLDS
    young, middle, full = ENGINE_GC_THRESHOLDS
    assert young >= 10 * 700 and middle >= 10 and full >= 10, "less often than the defaults"
    assert gc.isenabled(), "cycles are still collected"
