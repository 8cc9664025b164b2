"""Listing instances: the filter, the newest-first order, page tokens, and a page collected
with bounded memory.

Whatever feeds a list (the client's live status view, or a scan of the status topic) hands
every instance's latest status to a :class:`PageCollector` one at a time; the collector
keeps only the best ``limit + 1`` matches in a heap, so a list of a million instances holds
one page, not the million. Instances are ordered newest first by ``(created_ms,
instance_id)``; a page token is the position of the last instance of its page, so the next
page starts right after it, and instances created while someone pages (which sort before
the token) do not shift the pages that follow.

The filter is a table of small checks (``_CHECKS``): a new filter is a field and a check.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import count
from typing import Generic, TypeVar

from engine.core.errors import ConfigurationError, InvalidPageTokenError
from engine.core.history import RuntimeStatus
from engine.core.messages import InstanceStatus

__all__ = [
    "DEFAULT_PAGE",
    "ENGINE_ROW_PREFIX",
    "MAX_PAGE",
    "InstanceFilter",
    "InstancePage",
    "PageCollector",
    "page_token",
]

T = TypeVar("T")

#: The page size when none is asked for.
DEFAULT_PAGE = 100
#: The largest page a list serves; a bigger ``limit`` is refused, not silently cut.
MAX_PAGE = 1000
#: Tokens carry this format number first, so a future change can still read old ones.
_TOKEN_FORMAT = 1


@dataclass(frozen=True)
class InstanceFilter:
    """What a list picks; each filter left empty matches everything, and all must hold
    (every ``tags`` pair too)."""

    statuses: frozenset[RuntimeStatus] = frozenset()
    name: str = ""
    version: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    created_after_ms: int | None = None
    created_before_ms: int | None = None

    @classmethod
    def of(
        cls,
        *,
        status: RuntimeStatus | Iterable[RuntimeStatus] | None = None,
        name: str | None = None,
        version: str | None = None,
        tags: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        created_after_ms: int | None = None,
    ) -> InstanceFilter:
        """The filter from the client's keyword arguments."""
        statuses = {status} if isinstance(status, RuntimeStatus) else set(status or ())
        pairs = tags.items() if isinstance(tags, Mapping) else (tags or ())
        return cls(
            statuses=frozenset(statuses),
            name=name or "",
            version=version or "",
            tags=tuple(sorted((str(k), str(v)) for k, v in pairs)),
            created_after_ms=created_after_ms,
        )

    def matches(self, status: InstanceStatus) -> bool:
        return all(check(self, status) for check in _CHECKS)


#: Ids of the engine's own rows (schedules, concurrency slots): not instances, never listed.
ENGINE_ROW_PREFIX = "~"


def _instance_ok(f: InstanceFilter, s: InstanceStatus) -> bool:
    return not s.instance_id.startswith(ENGINE_ROW_PREFIX)


def _status_ok(f: InstanceFilter, s: InstanceStatus) -> bool:
    return not f.statuses or s.status in f.statuses


def _name_ok(f: InstanceFilter, s: InstanceStatus) -> bool:
    return not f.name or s.name == f.name


def _version_ok(f: InstanceFilter, s: InstanceStatus) -> bool:
    return not f.version or s.version == f.version


def _tags_ok(f: InstanceFilter, s: InstanceStatus) -> bool:
    return all(s.tags.get(key) == value for key, value in f.tags)


def _after_ok(f: InstanceFilter, s: InstanceStatus) -> bool:
    return f.created_after_ms is None or s.created_ms >= f.created_after_ms


def _before_ok(f: InstanceFilter, s: InstanceStatus) -> bool:
    return f.created_before_ms is None or s.created_ms < f.created_before_ms


_CHECKS: tuple[Callable[[InstanceFilter, InstanceStatus], bool], ...] = (
    _instance_ok,
    _status_ok,
    _name_ok,
    _version_ok,
    _tags_ok,
    _after_ok,
    _before_ok,
)


# --- page tokens ------------------------------------------------------------------------------


def page_token(status: InstanceStatus) -> str:
    """The token of the page that follows ``status`` (URL-safe text)."""
    raw = json.dumps([_TOKEN_FORMAT, status.created_ms, status.instance_id]).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _position(token: str) -> tuple[int, str]:
    """The position a token names, or InvalidPageTokenError saying what to pass instead."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        fmt, created_ms, instance_id = json.loads(raw)
        if fmt != _TOKEN_FORMAT or not isinstance(created_ms, int):
            raise ValueError("unknown format")
        if not isinstance(instance_id, str):
            raise ValueError("no instance id")
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidPageTokenError(
            f"page token {token[:40]!r} is not one a list handed out; pass the "
            f"next_page_token of the previous page as it was printed, or leave it out for "
            f"the first page"
        ) from None
    return created_ms, instance_id


# --- collecting a page ------------------------------------------------------------------------


@dataclass(frozen=True)
class InstancePage(Generic[T]):
    """One page of a list, newest first; ``next_page_token`` is None on the last page."""

    items: list[T]
    next_page_token: str | None


class PageCollector:
    """Picks one page out of statuses offered in any order, holding at most ``limit + 1``.

    ``held_peak`` is the most statuses it ever held at once (what a test counts to show
    that memory stays bounded); ``offered`` and ``matched`` count what it was shown.
    """

    def __init__(
        self, wanted: InstanceFilter, limit: int = DEFAULT_PAGE, page_token: str | None = None
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise ConfigurationError(f"limit {limit!r} is out of range; ask for 1 to {MAX_PAGE}")
        self.wanted = wanted
        self.limit = limit
        self._before = _position(page_token) if page_token else None
        # a min-heap of the best limit + 1 so far: the smallest position is dropped first
        self._heap: list[tuple[int, str, int, InstanceStatus]] = []
        self._tiebreak = count()
        self.held_peak = 0
        self.offered = 0
        self.matched = 0

    def add(self, status: InstanceStatus) -> None:
        """Offer one instance's latest status."""
        self.offered += 1
        if not self.wanted.matches(status):
            return
        position = (status.created_ms, status.instance_id)
        if self._before is not None and position >= self._before:
            return  # on an earlier page
        self.matched += 1
        entry = (status.created_ms, status.instance_id, next(self._tiebreak), status)
        if len(self._heap) <= self.limit:
            heapq.heappush(self._heap, entry)
            self.held_peak = max(self.held_peak, len(self._heap))
        else:
            heapq.heappushpop(self._heap, entry)

    def add_all(self, statuses: Iterable[InstanceStatus]) -> PageCollector:
        for status in statuses:
            self.add(status)
        return self

    def page(self) -> InstancePage[InstanceStatus]:
        best = [entry[3] for entry in sorted(self._heap, reverse=True)]
        items = best[: self.limit]
        more = len(best) > self.limit
        return InstancePage(items, page_token(items[-1]) if more else None)
