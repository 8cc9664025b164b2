"""The pure schedule logic: the cron parser against a brute-force oracle (Hypothesis), the
interval fire times, the catch-up split and the durations."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.cron import parse_cron
from engine.core.errors import ScheduleSpecError
from engine.core.schedules import (
    OverlapPolicy,
    ScheduleSpec,
    ScheduleState,
    due_fire_times,
    next_fire_time,
    parse_duration,
    run_id,
)

EPOCH_2026 = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
FIELDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))


def _oracle(fields: list[set[int]], restricted: tuple[bool, bool], after_ms: int) -> int:
    """The next match by walking whole days, then every hour and minute of a matching day
    (a different search from the parser's, which skips by field)."""
    minutes, hours, days, months, weekdays = fields
    day = datetime.fromtimestamp(after_ms / 1000, UTC).replace(hour=0, minute=0, second=0)
    day = day.replace(microsecond=0)
    for _ in range(366 * 9):
        in_month, in_week = day.day in days, (day.isoweekday() % 7) in weekdays
        ok = (in_month or in_week) if all(restricted) else (in_month and in_week)
        if day.month in months and ok:
            for h in sorted(hours):
                for m in sorted(minutes):
                    t = int(day.replace(hour=h, minute=m).timestamp() * 1000)
                    if t > after_ms:
                        return t
        day += timedelta(days=1)
    raise AssertionError("no match")


@st.composite
def _field(draw: st.DrawFn, low: int, high: int) -> tuple[str, set[int]]:
    """One field as text in one of the forms, with the values it stands for."""
    kind = draw(st.sampled_from(["star", "step", "range", "list", "range-step"]))
    if kind == "star":
        return "*", set(range(low, high + 1))
    if kind == "step":
        step = draw(st.integers(1, high - low + 1))
        return f"*/{step}", set(range(low, high + 1, step))
    a = draw(st.integers(low, high))
    b = draw(st.integers(a, high))
    if kind == "range":
        return f"{a}-{b}", set(range(a, b + 1))
    if kind == "range-step":
        step = draw(st.integers(1, 5))
        return f"{a}-{b}/{step}", set(range(a, b + 1, step))
    values = draw(st.sets(st.integers(low, high), min_size=1, max_size=4))
    return ",".join(str(v) for v in sorted(values)), values


@st.composite
def _expression(draw: st.DrawFn) -> tuple[str, list[set[int]], tuple[bool, bool]]:
    parts = [draw(_field(low, high)) for low, high in FIELDS]
    text = " ".join(p[0] for p in parts)
    restricted = (not parts[2][0].startswith("*"), not parts[4][0].startswith("*"))
    return text, [p[1] for p in parts], restricted


@settings(max_examples=150, deadline=None)
@given(_expression(), st.integers(0, 3 * 365 * 24 * 60))
def test_next_after_is_the_first_matching_minute(
    expression: tuple[str, list[set[int]], tuple[bool, bool]], offset_min: int
) -> None:
    text, fields, restricted = expression
    after = EPOCH_2026 + offset_min * 60_000 + 1234
    try:
        cron = parse_cron(text)
    except ScheduleSpecError as exc:
        assert "matches no time" in str(exc)  # e.g. day 30-31 of February only
        return
    found = cron.next_after(after)
    assert found == _oracle(fields, restricted, after)
    assert found > after and found % 60_000 == 0


def test_names_and_shortcuts_mean_their_numbers() -> None:
    assert parse_cron("0 9 * JAN-MAR MON-FRI").weekdays == parse_cron("0 9 * 1-3 1-5").weekdays
    assert parse_cron("0 9 * jan-mar mon").months == frozenset({1, 2, 3})
    assert parse_cron("0 0 * * 7").weekdays == frozenset({0})  # 7 is Sunday too
    assert parse_cron("@hourly").minutes == frozenset({0})
    daily = parse_cron("@daily")
    assert daily.next_after(EPOCH_2026) == EPOCH_2026 + 24 * 3600 * 1000


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("* * * *", "has 4 fields"),
        ("60 * * * *", "outside the minute"),
        ("* * 0 * *", "outside the day of month"),
        ("*/0 * * * *", "the step '0'"),
        ("5-1 * * * *", "runs backwards"),
        ("* * * FOO *", "not a number 1-12 or a name"),
        ("0 0 30 2 *", "matches no time"),
        ("x * * * *", "not a number"),
    ],
)
def test_bad_expressions_say_what_is_wrong(text: str, match: str) -> None:
    with pytest.raises(ScheduleSpecError, match=match):
        parse_cron(text)


@given(
    st.integers(1, 10_000).map(lambda s: s * 1000),
    st.integers(1, 10**9),  # epoch ms 0 stands for "no fire time": never a real time
    st.integers(0, 10**8),
    st.integers(0, 10**8),
)
def test_interval_fire_times_split_into_missed_and_caught_up(
    every_ms: int, anchor: int, since: int, window: int
) -> None:
    spec = ScheduleSpec("w", every_ms=every_ms, start_at_ms=anchor, catch_up_window_ms=window)
    first = next_fire_time(spec, anchor + since - 1)
    now = first + since
    due = due_fire_times(spec, first, now)
    every_fire_time = list(range(first, now + 1, every_ms))
    assert due.missed + len(due.times) == len(every_fire_time)
    assert due.times == [s for s in every_fire_time if s >= now - window]
    assert due.next_ms == (every_fire_time[-1] + every_ms if every_fire_time else first)
    assert (due.next_ms - anchor) % every_ms == 0


def test_an_end_stops_the_fire_times() -> None:
    spec = ScheduleSpec("w", every_ms=1000, start_at_ms=10_000, end_at_ms=12_000)
    assert next_fire_time(spec, 0) == 10_000
    assert next_fire_time(spec, 11_999) == 12_000
    assert next_fire_time(spec, 12_000) == 0
    assert due_fire_times(spec, 10_000, 20_000).times == [10_000, 11_000, 12_000]


def test_run_ids_name_the_fire_time() -> None:
    assert run_id("nightly", EPOCH_2026) == "nightly/2026-01-01T00:00:00Z"
    assert run_id("fast", EPOCH_2026 + 1500) == "fast/2026-01-01T00:00:01.500Z"
    assert run_id("n", EPOCH_2026, triggered=True) == "n/trigger-2026-01-01T00:00:00Z"


def test_durations() -> None:
    assert [parse_duration(t, "x") for t in ("30s", "5m", "1h", "2d", "500ms")] == [
        30_000,
        300_000,
        3_600_000,
        172_800_000,
        500,
    ]
    with pytest.raises(ScheduleSpecError, match="not a duration"):
        parse_duration("1.5h", "the interval")


def test_state_defaults_are_an_active_skip_schedule() -> None:
    state = ScheduleState(ScheduleSpec("w", every_ms=1000))
    assert state.spec.overlap is OverlapPolicy.SKIP and not state.paused
