"""Exceptions raised into workflow code for failures that happened elsewhere.

An activity or child workflow failed in another process; only its
:class:`~engine.core.failure.FailureDetails` came back. The error raised into the workflow
(``ActivityFailedError`` and friends) gets a :class:`RemoteFailure` as its ``__cause__``,
so that if the workflow lets it escape, the instance's failure details keep the original
failure (type, message, stack and causes) in their cause chain, and ``except`` blocks can
look at it too.
"""

from __future__ import annotations

from typing import TypeVar

from engine.core.errors import WorkflowFailure
from engine.core.failure import FailureDetails


class RemoteFailure(Exception):
    """A failure that happened in another process, rebuilt from its details."""

    def __init__(self, details: FailureDetails) -> None:
        super().__init__(details.message)
        self.details = details
        self.type = details.type

    def __str__(self) -> str:
        return self.details.message


E = TypeVar("E", bound=WorkflowFailure)


def raised_from(error: E, details: FailureDetails) -> E:
    """``error`` with the remote failure ``details`` as its cause."""
    error.__cause__ = RemoteFailure(details)
    return error
