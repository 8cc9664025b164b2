"""Five-field cron expressions, parsed and searched without any library (pure core).

``minute hour day-of-month month day-of-week``, matched against the wall-clock time of a
time zone (UTC unless one is given). Each field takes ``*``,
a number, a range ``a-b``, a step ``*/n``, ``a-b/n`` or ``a/n`` (from ``a`` to the field's
end), and comma-separated lists of those; months and weekdays also take their English
three-letter names (``JAN``-``DEC``, ``SUN``-``SAT``; weekday 7 is Sunday too). As in
Vixie cron, when both day fields are restricted a day matches if either does. The
shortcuts ``@yearly``, ``@monthly``, ``@weekly``, ``@daily`` and ``@hourly`` stand for
their usual expressions. A schedule needs to know the next fire time after a given time, and
nothing else, so that is the one question :meth:`Cron.next_after` answers.

Time zones: the zone comes in as a ``tzinfo`` (an offset for any instant), not as a name.
Turning a name into offsets reads the system's time zone database (``zoneinfo``), which
is I/O whose answer depends on the host; the service layer does that
(``engine/services/time_zones.py``) and this module stays pure. Matching is literal, as in
Temporal's schedules: an instant is a fire time when the wall-clock time in the zone at that
instant matches the fields. So a time that a spring-forward transition skips (02:30 on
the night Europe/Paris goes from 02:00 to 03:00) does not occur and its fire time is skipped,
and a time that a fall-back transition repeats (02:30 on the night Paris goes from 03:00
back to 02:00) occurs twice and is a fire time both times, an hour apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo

from engine.core.errors import ScheduleSpecError

_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_SHORTCUTS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: (name, lowest, highest, names for lowest.. in order) of the five fields.
_FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
#: How far ahead a search looks before it calls the expression unsatisfiable (Feb 30).
_HORIZON_YEARS = 8
#: A zone's offset is checked at least this often between two instants, to find where it
#: changes: a change and a change back within one probe would go unseen, and in the tz
#: database two changes of one zone since 1970 are a week apart at the least.
_OFFSET_PROBE_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed expression: the allowed values of each field."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday .. 6 = Saturday
    days_restricted: bool
    weekdays_restricted: bool

    def matches_day(self, when: datetime) -> bool:
        in_month = when.day in self.days
        in_week = (when.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_month or in_week
        return in_month and in_week

    def next_after(self, after_ms: int, zone: tzinfo = UTC) -> int:
        """The first fire time strictly after ``after_ms`` (epoch ms): the first instant whose
        wall-clock time in ``zone`` is a matching minute.

        Between two offset changes the zone's wall clock is UTC shifted by a constant, so
        the search is the UTC one, shifted; when the offset changes before the fire time it
        found, the search starts again at the change with the new offset (which skips the
        wall times a spring-forward jumps over and visits again those a fall-back repeats).
        """
        if zone is UTC:
            return self._next_wall_after(after_ms)
        start = after_ms + 1  # the first instant that may be the fire time
        while True:
            offset = _offset_ms(zone, start)
            fire = self._next_wall_after(start - 1 + offset) - offset
            change = _offset_change(zone, start, fire, offset)
            if change is None:
                return fire
            start = change

    def _next_wall_after(self, after_ms: int) -> int:
        """The first matching minute strictly after ``after_ms``, both as wall-clock
        times written as epoch ms (in UTC they are the instants themselves)."""
        when = datetime.fromtimestamp(after_ms // 60000 * 60, UTC) + timedelta(minutes=1)
        limit = when.year + _HORIZON_YEARS
        while when.year <= limit:
            if when.month not in self.months:
                when = _next_month(when)
            elif not self.matches_day(when):
                when = (when + timedelta(days=1)).replace(hour=0, minute=0)
            elif when.hour not in self.hours:
                when = (when + timedelta(hours=1)).replace(minute=0)
            else:
                later = [m for m in sorted(self.minutes) if m >= when.minute]
                if later:
                    return int(when.replace(minute=later[0]).timestamp() * 1000)
                when = (when + timedelta(hours=1)).replace(minute=0)
        raise ScheduleSpecError(
            f"cron expression {self.text!r} matches no time in the next {_HORIZON_YEARS} "
            f"years (a day that does not exist, like February 30?); fix the day fields"
        )


def _offset_ms(zone: tzinfo, at_ms: int) -> int:
    """The zone's offset from UTC at the instant ``at_ms``, in ms."""
    offset = datetime.fromtimestamp(at_ms // 1000, zone).utcoffset()
    return 0 if offset is None else offset // timedelta(milliseconds=1)


def _offset_change(zone: tzinfo, start_ms: int, end_ms: int, offset_ms: int) -> int | None:
    """The first instant in ``(start_ms, end_ms]`` where the zone's offset is no longer
    ``offset_ms`` (it is at ``start_ms``), or None when it holds throughout."""
    low = start_ms
    while low < end_ms:
        high = min(low + _OFFSET_PROBE_MS, end_ms)
        if _offset_ms(zone, high) == offset_ms:
            low = high
            continue
        while high - low > 1:  # offset(low) is the old one, offset(high) is not
            middle = (low + high) // 2
            if _offset_ms(zone, middle) == offset_ms:
                low = middle
            else:
                high = middle
        return high
    return None


def _next_month(when: datetime) -> datetime:
    year, month = (when.year + 1, 1) if when.month == 12 else (when.year, when.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


def parse_cron(text: str) -> Cron:
    """Parse an expression; :class:`ScheduleSpecError` says what is wrong and where."""
    expanded = _SHORTCUTS.get(text.strip().lower(), text)
    parts = expanded.split()
    if len(parts) != 5:
        raise ScheduleSpecError(
            f"cron expression {text!r} has {len(parts)} fields; write five: minute hour "
            f"day-of-month month day-of-week (e.g. '*/5 * * * *'), or @hourly/@daily/..."
        )
    values = [_field(text, part, spec) for part, spec in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(d % 7 for d in values[4])
    cron = Cron(
        text=text,
        minutes=values[0],
        hours=values[1],
        days=values[2],
        months=values[3],
        weekdays=weekdays,
        days_restricted=not parts[2].startswith("*"),
        weekdays_restricted=not parts[4].startswith("*"),
    )
    cron.next_after(0)  # refuses an expression that never matches, now rather than later
    return cron


def _field(text: str, part: str, spec: tuple[str, int, int, tuple[str, ...]]) -> frozenset[int]:
    name, low, high, names = spec
    allowed: set[int] = set()
    for item in part.split(","):
        allowed |= _item(text, item, name, low, high, names)
    return frozenset(allowed)


def _item(text: str, item: str, name: str, low: int, high: int, names: tuple[str, ...]) -> set[int]:
    base, _, step_text = item.partition("/")
    step = 1
    if step_text:
        if not step_text.isdigit() or not 1 <= int(step_text) <= high - low + 1:
            raise ScheduleSpecError(
                f"cron expression {text!r}: the step {step_text!r} of the {name} field must "
                f"be a whole number from 1 to {high - low + 1}"
            )
        step = int(step_text)
    if base == "*":
        first, last = low, high
    elif "-" in base:
        start, _, end = base.partition("-")
        first = _number(text, start, name, low, high, names)
        last = _number(text, end, name, low, high, names)
        if first > last:
            raise ScheduleSpecError(
                f"cron expression {text!r}: the {name} range {base!r} runs backwards; "
                f"write the lower bound first"
            )
    else:
        first = _number(text, base, name, low, high, names)
        last = high if step_text else first
    return set(range(first, last + 1, step))


def _number(text: str, token: str, name: str, low: int, high: int, names: tuple[str, ...]) -> int:
    upper = token.strip().upper()
    if upper in names:
        return names.index(upper) + low
    if not upper.isdigit():
        hint = f" or a name ({', '.join(names)})" if names else ""
        raise ScheduleSpecError(
            f"cron expression {text!r}: {token!r} in the {name} field is not a number "
            f"{low}-{high}{hint}"
        )
    value = int(upper)
    if not low <= value <= high:
        raise ScheduleSpecError(
            f"cron expression {text!r}: {value} is outside the {name} field's {low}-{high}"
        )
    return value
