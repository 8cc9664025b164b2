"""Cron schedules in a time zone: fire times are the instants whose wall-clock time in the zone
matches (as Temporal's schedules do), so a time a spring-forward skips has no fire time that day
and a time a fall-back repeats has two. Checked against a brute-force walk over every
minute (Hypothesis), with starting points around real offset changes, and on the test
engine through a DST night in Paris."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Registry, WorkflowContext
from engine.core.cron import parse_cron
from engine.core.errors import ScheduleSpecError
from engine.core.schedules import ScheduleSpec, check_spec, due_fire_times, run_id
from engine.services.time_zones import resolve_zone
from engine.testing import TestEngine

PARIS = ZoneInfo("Europe/Paris")


def _ms(text: str) -> int:
    """An ISO instant with its offset, as epoch ms."""
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%MZ")


def _fire_times(expression: str, zone: ZoneInfo, after: str, count: int) -> list[str]:
    cron, out, at = parse_cron(expression), [], _ms(after)
    for _ in range(count):
        at = cron.next_after(at, zone)
        out.append(_utc(at))
    return out


def test_a_time_the_spring_forward_skips_has_no_fire_time_that_day() -> None:
    # 2026-03-29 in Paris: 02:00 CET is followed by 03:00 CEST; there is no 02:30
    assert _fire_times("30 2 * * *", PARIS, "2026-03-27T12:00+00:00", 3) == [
        "2026-03-28T01:30Z",  # 02:30 CET
        "2026-03-30T00:30Z",  # 02:30 CEST: the 29th has none
        "2026-03-31T00:30Z",
    ]


def test_a_time_the_fall_back_repeats_has_two_fire_times() -> None:
    # 2026-10-25 in Paris: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice
    assert _fire_times("30 2 * * *", PARIS, "2026-10-24T12:00+00:00", 3) == [
        "2026-10-25T00:30Z",  # 02:30 CEST
        "2026-10-25T01:30Z",  # 02:30 CET, an hour later
        "2026-10-26T01:30Z",
    ]


def test_an_hourly_schedule_keeps_its_pace_through_both_changes() -> None:
    spring = _fire_times("0 * * * *", PARIS, "2026-03-28T23:30+00:00", 3)
    assert spring == ["2026-03-29T00:00Z", "2026-03-29T01:00Z", "2026-03-29T02:00Z"]
    fall = _fire_times("0 * * * *", PARIS, "2026-10-24T23:30+00:00", 3)
    assert fall == ["2026-10-25T00:00Z", "2026-10-25T01:00Z", "2026-10-25T02:00Z"]


def test_a_zone_a_quarter_hour_off_and_a_day_that_never_was() -> None:
    assert _fire_times("0 9 * * *", ZoneInfo("Asia/Kathmandu"), "2026-01-01T00:00+00:00", 1) == [
        "2026-01-01T03:15Z"
    ]
    # Samoa skipped 2011-12-30 altogether (from -10 to +14 at its midnight)
    assert _fire_times("0 12 * * *", ZoneInfo("Pacific/Apia"), "2011-12-29T00:00+00:00", 2) == [
        "2011-12-29T22:00Z",  # noon on the 29th, -10
        "2011-12-30T22:00Z",  # noon on the 31st, +14: the 30th has no noon
    ]


# --- against a brute-force walk ---------------------------------------------------------------

ZONES = (
    "Europe/Paris",
    "America/New_York",
    "America/Sao_Paulo",
    "Australia/Lord_Howe",  # half an hour of DST
    "Asia/Kathmandu",
    "Pacific/Chatham",
    "Pacific/Apia",
)
#: Instants close to offset changes of the zones above (and to none).
ANCHORS = (
    "2026-03-29T01:00+00:00",
    "2026-10-25T01:00+00:00",
    "2026-03-08T07:00+00:00",
    "2026-11-01T06:00+00:00",
    "2026-04-04T15:00+00:00",
    "2026-10-03T15:30+00:00",
    "2011-12-30T10:00+00:00",
    "2026-06-15T12:00+00:00",
)


def _brute(hours: set[int], minutes: set[int], zone: ZoneInfo, after_ms: int) -> int:
    """The first whole UTC minute after ``after_ms`` whose wall time in ``zone`` matches
    (every zone here is a whole number of minutes off UTC)."""
    at = after_ms // 60_000 * 60_000 + 60_000
    for _ in range(5 * 24 * 60):
        wall = datetime.fromtimestamp(at / 1000, zone)
        if wall.hour in hours and wall.minute in minutes:
            return at
        at += 60_000
    raise AssertionError("no match within five days")


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(ZONES),
    st.sampled_from(ANCHORS),
    st.integers(-2 * 24 * 60, 2 * 24 * 60),
    st.sets(st.integers(0, 23), min_size=1, max_size=3),
    st.sets(st.integers(0, 59), min_size=1, max_size=3),
)
def test_the_next_fire_time_is_the_first_minute_whose_wall_time_matches(
    zone_name: str, anchor: str, shift_min: int, hours: set[int], minutes: set[int]
) -> None:
    zone = ZoneInfo(zone_name)
    after = _ms(anchor) + shift_min * 60_000 + 7
    text = f"{','.join(map(str, sorted(minutes)))} {','.join(map(str, sorted(hours)))} * * *"
    assert parse_cron(text).next_after(after, zone) == _brute(hours, minutes, zone, after)


# --- specs, names and the engine ----------------------------------------------------------------


def test_zone_names_are_resolved_by_the_service_layer() -> None:
    assert resolve_zone("UTC") is UTC
    assert resolve_zone("Europe/Paris") == PARIS
    for bad in ("Mars/Olympus_Mons", "../etc/passwd", ""):
        with pytest.raises(ScheduleSpecError, match="time zone"):
            resolve_zone(bad)


def test_a_time_zone_belongs_to_cron_schedules() -> None:
    with pytest.raises(ScheduleSpecError, match="time zone applies to a cron schedule"):
        check_spec(ScheduleSpec(workflow="w", every_ms=60_000, timezone="Europe/Paris"))
    assert check_spec(ScheduleSpec(workflow="w", cron="0 9 * * *", timezone="Europe/Paris"))


def test_due_fire_times_read_the_zone() -> None:
    spec = ScheduleSpec(
        workflow="w", cron="30 2 * * *", timezone="Europe/Paris", catch_up_window_ms=10**8
    )
    first = _ms("2026-10-25T00:30+00:00")
    due = due_fire_times(spec, first, _ms("2026-10-25T02:00+00:00"), PARIS)
    assert [_utc(s) for s in due.times] == ["2026-10-25T00:30Z", "2026-10-25T01:30Z"]
    assert _utc(due.next_ms) == "2026-10-26T01:30Z"


registry = Registry()


@registry.workflow(name="night-job")
async def night_job(ctx: WorkflowContext, _: object) -> str:
    return "done"


@pytest.fixture
def env() -> Iterator[TestEngine]:
    with TestEngine(registry, start=datetime(2026, 3, 27, 12, tzinfo=UTC)) as engine:
        yield engine


def test_a_paris_schedule_through_both_changes_of_a_year(env: TestEngine) -> None:
    env.create_schedule("nightly", "night-job", cron="30 2 * * *", timezone="Europe/Paris")
    described = env.describe_schedule("nightly")
    assert described is not None and described["timezone"] == "Europe/Paris"
    env.advance(timedelta(days=4))  # through 2026-03-29, which has no 02:30 in Paris
    env.advance(datetime(2026, 10, 26, 12, tzinfo=UTC) - env.now())
    started = {
        _utc(_ms(r.instance_id.split("/", 1)[1].replace("Z", "+00:00")))
        for r in env.client.list_instances(name="night-job")
    }
    spring = {"2026-03-28T01:30Z", "2026-03-30T00:30Z", "2026-03-31T00:30Z"}
    assert spring <= started and not any(s.startswith("2026-03-29") for s in started)
    assert {"2026-10-25T00:30Z", "2026-10-25T01:30Z"} <= started  # twice that night
    assert run_id("nightly", _ms("2026-10-25T01:30+00:00")) == "nightly/2026-10-25T01:30:00Z"


def test_an_unknown_zone_is_refused_before_anything_is_sent(env: TestEngine) -> None:
    with pytest.raises(ScheduleSpecError, match="Mars/Base"):
        env.create_schedule("x", "night-job", cron="0 9 * * *", timezone="Mars/Base")
    assert env.describe_schedule("x") is None
