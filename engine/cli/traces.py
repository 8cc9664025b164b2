"""The process's traces: configured once from the OTEL_* variables, flushed at exit.

``main`` calls :func:`process_tracing` before every command, so a bad
``OTEL_TRACES_EXPORTER`` is one clear error and the client's start span of ``turnstile
start`` is exported like the processor's and the worker's spans; ``run processor|worker|
all`` and ``demo`` hand its hook to the replicas and workers they build.
"""

from __future__ import annotations

import atexit
import functools

from engine.services.tracing import TraceHook


@functools.cache
def process_tracing() -> TraceHook | None:
    """The tracing hook for this process (None: no traces asked for, or the extra is not
    installed; a warning says so in the second case)."""
    from engine.adapters.tracing import tracing_from_env

    tracing = tracing_from_env()
    if tracing is None:
        return None
    atexit.register(tracing.shutdown)
    return tracing.hook


__all__ = ["process_tracing"]
