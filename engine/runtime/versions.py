"""Workflow versions: their order, and which one a start without a version runs.

A workflow name may be registered under several versions at once (old code for running
instances, new code for new ones). A start that names no version runs the name's *default*:
the version registered with ``default=True`` if there is one, otherwise the newest
registered version in :func:`version_key` order. The version a start ran is recorded in its
``ExecutionStarted``, so an instance stays on it when a newer default is deployed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_RUNS = re.compile(r"(\d+)")


def version_key(version: str) -> tuple[tuple[int, int, str], ...]:
    """The sort key of a version string: runs of digits compare as numbers, the text
    between them as text, so ``"2" < "10"``, ``"v1.9" < "v1.10"`` and
    ``"2024-01-31" < "2024-02-01"``; where a number meets text the number sorts first
    (``"1" < "v1"``). The empty version (an unversioned registration) sorts before every
    other one."""
    parts: list[tuple[int, int, str]] = []
    for index, run in enumerate(_RUNS.split(version)):
        if not run:
            continue
        if index % 2:  # a run of digits
            parts.append((0, int(run), run))
        else:
            parts.append((1, 0, run))
    return tuple(parts)


def newest(versions: Iterable[str]) -> str:
    """The newest of ``versions`` in :func:`version_key` order (ties: the longer text)."""
    return max(versions, key=lambda v: (version_key(v), v))
