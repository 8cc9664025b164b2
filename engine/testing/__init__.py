"""Test workflows without a broker: ``from engine.testing import TestEngine``.

:class:`TestEngine` runs the real processor state machine over in-memory topics and the
in-memory store, runs real activity functions (or replacements the test passes, such as
:func:`takes` fakes that last a declared span of engine time) and the triggers' mapping,
and skips time when nothing runs: waiting for a result jumps to the next due timer, while
a running activity moves engine time with the wall clock. See docs/how-to/testing.md.
"""

from engine.testing.engine import ManualClock, TestEngine
from engine.testing.fakes import Takes, takes
from engine.testing.topics import MemoryTopics

__all__ = ["ManualClock", "MemoryTopics", "Takes", "TestEngine", "takes"]
