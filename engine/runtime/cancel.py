"""Cancellation uses the standard ``asyncio.CancelledError`` class, imported lazily.

Workflow authors already know ``except asyncio.CancelledError`` from asyncio code, so the
runtime throws that very class into cancelled coroutines. Importing ``asyncio`` costs tens of
milliseconds and loads socket and ssl modules, which workflow code and auditors should not
pay for: the class is fetched on first use only (a workflow that never cancels anything
never imports asyncio).
"""

from __future__ import annotations

import sys


def cancelled_error(message: str = "") -> BaseException:
    """A new ``asyncio.CancelledError``."""
    from asyncio import CancelledError

    return CancelledError(message) if message else CancelledError()


def is_cancelled(exc: BaseException | None) -> bool:
    """True if ``exc`` is an ``asyncio.CancelledError`` (without importing asyncio)."""
    if exc is None:
        return False
    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and isinstance(exc, asyncio.CancelledError)


def cancelled_error_class() -> type[BaseException]:
    """The ``asyncio.CancelledError`` class (imports asyncio)."""
    from asyncio import CancelledError

    return CancelledError
