"""Test workflows without a broker: ``from engine.testing import TestEngine``.

:class:`TestEngine` runs the real processor state machine over in-memory topics and the
in-memory store, runs real activity functions (or replacements the test passes), and skips
time: waiting for a result jumps to the next due timer. See the README, "Testing
workflows".
"""

from engine.testing.engine import ManualClock, TestEngine
from engine.testing.topics import MemoryTopics

__all__ = ["ManualClock", "MemoryTopics", "TestEngine"]
