"""Listing instances: filters (tags AND), newest-first pages that follow tokens, and memory
bounded by one page - counted in what the collector and the on-disk fold hold."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.adapters.status_scan import StatusFold
from engine.codec import encode_message
from engine.core.errors import ConfigurationError, InvalidPageTokenError
from engine.core.history import RuntimeStatus
from engine.core.messages import InstanceStatus
from engine.services.client.listing import MAX_PAGE, InstanceFilter, PageCollector, page_token


def _status(i: int, created_ms: int | None = None, **kw: object) -> InstanceStatus:
    base: dict[str, object] = {
        "instance_id": f"i{i:05d}",
        "name": "w",
        "status": RuntimeStatus.RUNNING,
        "created_ms": 1000 + i if created_ms is None else created_ms,
    }
    base.update(kw)
    return InstanceStatus(**base)  # type: ignore[arg-type]


def _all_pages(statuses: list[InstanceStatus], wanted: InstanceFilter, limit: int) -> list[str]:
    seen: list[str] = []
    token = None
    while True:
        collector = PageCollector(wanted, limit, token).add_all(statuses)
        page = collector.page()
        assert collector.held_peak <= limit + 1
        assert len(page.items) <= limit
        seen += [s.instance_id for s in page.items]
        token = page.next_page_token
        if token is None:
            return seen


def test_tags_must_all_match_and_statuses_any() -> None:
    rows = [
        _status(1, tags={"customer": "c-42", "tier": "gold"}),
        _status(2, tags={"customer": "c-42"}, status=RuntimeStatus.COMPLETED),
        _status(3, tags={"customer": "c-7", "tier": "gold"}, status=RuntimeStatus.FAILED),
    ]

    def ids(wanted: InstanceFilter) -> list[str]:
        return [s.instance_id for s in PageCollector(wanted).add_all(rows).page().items]

    assert ids(InstanceFilter.of(tags={"customer": "c-42"})) == ["i00002", "i00001"]
    assert ids(InstanceFilter.of(tags={"customer": "c-42", "tier": "gold"})) == ["i00001"]
    assert ids(InstanceFilter.of(tags=[("tier", "gold")])) == ["i00003", "i00001"]
    failed_or_done = [RuntimeStatus.FAILED, RuntimeStatus.COMPLETED]
    assert ids(InstanceFilter.of(status=failed_or_done)) == ["i00003", "i00002"]
    assert ids(InstanceFilter.of(created_after_ms=1002)) == ["i00003", "i00002"]  # at or after
    assert ids(InstanceFilter.of(name="other")) == []


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    created=st.lists(st.integers(0, 5), max_size=60),  # many share a creation time
    limit=st.integers(1, 12),
    gold=st.sets(st.integers(0, 59)),
)
def test_pages_list_every_match_once_newest_first(
    created: list[int], limit: int, gold: set[int]
) -> None:
    rows = [
        _status(i, created_ms=c, tags={"tier": "gold"} if i in gold else {})
        for i, c in enumerate(created)
    ]
    wanted = InstanceFilter.of(tags={"tier": "gold"})
    expected = sorted(
        (s for s in rows if wanted.matches(s)),
        key=lambda s: (s.created_ms, s.instance_id),
        reverse=True,
    )
    assert _all_pages(rows, wanted, limit) == [s.instance_id for s in expected]
    assert _all_pages(list(reversed(rows)), wanted, limit) == [s.instance_id for s in expected]


def test_instances_created_while_paging_do_not_shift_the_next_pages() -> None:
    rows = [_status(i) for i in range(10)]
    first = PageCollector(InstanceFilter(), 4).add_all(rows).page()
    newer = [_status(100 + i) for i in range(5)]  # created later: they sort first
    second = PageCollector(InstanceFilter(), 4, first.next_page_token).add_all(rows + newer)
    assert [s.instance_id for s in second.page().items] == [f"i{i:05d}" for i in (5, 4, 3, 2)]


def test_bad_tokens_and_limits_say_what_to_pass() -> None:
    for token in ["nope", "e30", page_token(_status(1))[:-3] + "!!!"]:
        with pytest.raises(InvalidPageTokenError, match="next_page_token of the previous page"):
            PageCollector(InstanceFilter(), 10, token)
    for limit in (0, MAX_PAGE + 1):
        with pytest.raises(ConfigurationError, match=f"ask for 1 to {MAX_PAGE}"):
            PageCollector(InstanceFilter(), limit)


def test_the_fold_keeps_the_latest_record_per_instance_and_holds_one_batch(
    tmp_path: Path,
) -> None:
    """2,000 instances, each with three status records and every tenth purged (a tombstone),
    as an uncompacted status topic holds them; the fold never holds more than its batch in
    memory and the pages hold one page."""
    count, batch, limit = 2000, 256, 100
    with StatusFold(tmp_path / "fold", batch=batch) as fold:
        for step in (RuntimeStatus.PENDING, RuntimeStatus.RUNNING, RuntimeStatus.COMPLETED):
            for i in range(count):
                status = _status(i, status=step, tags={"even": str(i % 2 == 0).lower()})
                fold.apply(status.instance_id.encode(), encode_message(status))
        for i in range(0, count, 10):
            fold.apply(f"i{i:05d}".encode(), None)
        fold.apply(None, b"no key")
        assert fold.held_peak <= batch
        wanted = InstanceFilter.of(tags={"even": "true"}, status=RuntimeStatus.COMPLETED)
        seen: list[str] = []
        token = None
        while True:
            collector = PageCollector(wanted, limit, token).add_all(fold.statuses())
            assert collector.offered == count - count // 10  # one latest status per instance
            assert collector.held_peak <= limit + 1
            page = collector.page()
            seen += [s.instance_id for s in page.items]
            token = page.next_page_token
            if token is None:
                break
        kept = [i for i in reversed(range(count)) if i % 2 == 0 and i % 10 != 0]
        assert seen == [f"i{i:05d}" for i in kept]
        assert fold.skipped == 1
