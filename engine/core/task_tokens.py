"""Task tokens: how an activity attempt that completes later is named outside the worker.

An activity that calls ``current_activity().complete_later()`` leaves its attempt open and
hands its task token to whoever finishes it (a person approving, a webhook), possibly in
another process, much later. The token names exactly what the processor matches an
activity result against - instance, run id, generation, task id and attempt - so the
result a client writes from it is the record the worker would have written, and the
processor's existing checks (other run, finished call, stale attempt) keep it exactly once.

The token is opaque to its holders: a version prefix and URL-safe base64 of a JSON array,
so it survives URLs, e-mails and shell arguments unchanged. It carries no secret and grants
nothing a client could not do anyway (a client may already raise events and terminate).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from engine.core.errors import InvalidTaskTokenError

__all__ = ["TaskToken"]

_PREFIX = "tt1."


@dataclass(frozen=True, slots=True)
class TaskToken:
    """One activity attempt, as a task token names it."""

    instance_id: str
    run_id: str
    generation: int
    task_id: int
    attempt: int

    def encode(self) -> str:
        """The opaque string handed out (``tt1.`` and base64 of the fields)."""
        fields = [self.instance_id, self.run_id, self.generation, self.task_id, self.attempt]
        raw = json.dumps(fields, separators=(",", ":")).encode("utf-8")
        return _PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, token: str) -> TaskToken:
        """The attempt ``token`` names; :class:`InvalidTaskTokenError` for any string no
        activity handed out."""
        if not isinstance(token, str) or not token.startswith(_PREFIX):
            raise InvalidTaskTokenError(
                f"{token!r} is not a task token (they begin with {_PREFIX!r}); pass the "
                f"exact string current_activity().task_token returned"
            )
        body = token[len(_PREFIX) :]
        try:
            fields = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (binascii.Error, ValueError, UnicodeDecodeError):
            fields = None
        if not _well_formed(fields):
            raise InvalidTaskTokenError(
                f"task token {token!r} is damaged (truncated or edited); pass the exact "
                f"string current_activity().task_token returned"
            )
        instance_id, run_id, generation, task_id, attempt = fields
        return cls(instance_id, run_id, generation, task_id, attempt)


def _well_formed(fields: object) -> bool:
    if not isinstance(fields, list) or len(fields) != 5:
        return False
    instance_id, run_id, *numbers = fields
    return (
        isinstance(instance_id, str)
        and bool(instance_id)
        and isinstance(run_id, str)
        and all(type(n) is int and n >= 0 for n in numbers)
        and numbers[2] >= 1
    )
