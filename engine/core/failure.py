"""Failure details: how an exception is remembered in history and crosses process borders.

An exception object cannot be replayed or sent to another process, so the engine keeps its
type name, message, formatted stack, retryability and the chain of causes.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FailureDetails:
    type: str
    message: str
    stack: str = ""
    retryable: bool = True
    cause: FailureDetails | None = None

    def chain(self) -> list[FailureDetails]:
        """This failure followed by its causes, outermost first."""
        out: list[FailureDetails] = []
        node: FailureDetails | None = self
        while node is not None:
            out.append(node)
            node = node.cause
        return out

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"


_MAX_CAUSE_DEPTH = 16


def failure_from_exception(exc: BaseException, *, retryable: bool | None = None) -> FailureDetails:
    """Capture an exception (and its ``__cause__``/``__context__`` chain) as details."""
    return _capture(exc, retryable, 0)


def _capture(exc: BaseException, retryable: bool | None, depth: int) -> FailureDetails:
    details = getattr(exc, "details", None)
    if isinstance(details, FailureDetails) and details.message == str(exc):
        return details
    cause_exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    cause = None
    if cause_exc is not None and depth < _MAX_CAUSE_DEPTH:
        cause = _capture(cause_exc, None, depth + 1)
    if retryable is None:
        retryable = not bool(getattr(exc, "non_retryable", False))
    type_name = getattr(exc, "type", None)
    if not isinstance(type_name, str):
        type_name = type(exc).__name__
    stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False))
    return FailureDetails(type_name, str(exc), stack, retryable, cause)
