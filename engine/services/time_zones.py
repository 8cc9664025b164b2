"""Time zone names to offsets, for cron schedules (``ScheduleSpec.timezone``).

The pure core matches cron expressions against a ``tzinfo`` it is handed
(``engine/core/cron.py``); making one from a name is done here because it reads the IANA
time zone database: the system's (``/usr/share/zoneinfo``) or, where the system has none
(slim container images), the ``tzdata`` package, which ``zoneinfo`` falls back to by
itself. ``ZoneInfo`` keeps each zone it loaded, so a name is read from disk once per
process. The database's version is the host's: replicas with different versions could
disagree about a zone whose rules changed, which is why a schedule keeps the slot it
armed (``next_fire_ms``) and the next one is computed by whichever replica fires it.
"""

from __future__ import annotations

from datetime import UTC, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from engine.core.errors import ScheduleSpecError

__all__ = ["resolve_zone"]


def resolve_zone(name: str) -> tzinfo:
    """The zone called ``name`` (``UTC``: the fixed one, which the cron search takes a
    shortcut for); :class:`ScheduleSpecError` saying what to use for an unknown name."""
    if name == "UTC":
        return UTC
    if not name or name.startswith(("/", ".")) or ".." in name:
        raise ScheduleSpecError(f"time zone {name!r} is not an IANA zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ScheduleSpecError(
            f"time zone {name!r} is not in this host's time zone database ({exc}); use an "
            f"IANA name such as Europe/Paris or America/New_York, or install the tzdata "
            f"package (pip install tzdata) where the system has none"
        ) from None
