"""Task queue names: which workers an activity attempt is for.

Each task queue is its own Kafka topic (``<namespace>.activity-tasks`` for the default
queue, ``<namespace>.activity-tasks.<queue>`` for the others), so a worker consumes exactly
the queues it serves (``run worker --task-queue Q``) and two kinds of worker in one
namespace never see each other's tasks. The name becomes part of a topic name, hence the
restricted alphabet.
"""

from __future__ import annotations

import re

from engine.core.errors import ConfigurationError

__all__ = ["DEFAULT_TASK_QUEUE", "check_task_queue"]

#: The queue of activities that name none; its topic is ``<namespace>.activity-tasks``.
DEFAULT_TASK_QUEUE = "default"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")


def check_task_queue(name: str) -> str:
    """``name`` if it can name a task queue (and its topic); else a ConfigurationError."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise ConfigurationError(
            f"task queue {name!r} is not a valid name: use 1-100 letters, digits, '_' or '-', "
            f"starting with a letter or digit (it becomes part of a Kafka topic name)"
        )
    return name
