"""What the history, replay and audit commands share: progress lines, times, and reading
history from the topic or from exported files."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from engine.adapters.kafka.history import TopicReader
from engine.codec import decode_history, read_history_file
from engine.core.errors import CodecError, ConfigurationError
from engine.core.history import HistoryEvent
from engine.core.keys import instance_key, murmur2_partition
from engine.services.audit.records import EventFilter, RawRecord, ReadProgress

__all__ = [
    "EXIT_PROBLEMS",
    "Progress",
    "decoded_events",
    "file_events",
    "instance_partitions",
    "iso_time_ms",
    "warn",
]

EXIT_PROBLEMS = 1
"""Exit code when a check finds a problem (a broken chain, a divergence, a difference)."""

#: Reads shorter than this print no progress at all.
_QUIET_FOR_S = 1.0


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


class Progress:
    """Progress lines on stderr for long reads (a read shorter than a second prints none)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._tty = sys.stderr.isatty()

    def __call__(self, progress: ReadProgress) -> None:
        if not self.enabled or progress.elapsed_s < _QUIET_FOR_S:
            return
        rate = progress.records / progress.elapsed_s if progress.elapsed_s > 0 else 0.0
        done = progress.partitions_done == progress.partitions
        line = (
            f"reading {progress.topic}: {progress.records:,} records, "
            f"{progress.partitions_done}/{progress.partitions} partitions, "
            f"{progress.fraction:.0%}, {rate:,.0f} records/s, {progress.elapsed_s:.1f}s"
        )
        if self._tty:
            print(f"\r{line}", end="\n" if done else "", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)


def iso_time_ms(text: str) -> int:
    """An argparse type: an ISO 8601 time (UTC if it names no zone) as epoch milliseconds."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time ({exc}), e.g. 2030-01-31T09:00:00Z or 2030-01-31"
        ) from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def instance_partitions(reader: TopicReader, topic: str, instances: Sequence[str]) -> list[int]:
    """The partitions that hold these instances (each partition once, sorted)."""
    count = reader.partition_count(topic)
    return sorted({murmur2_partition(instance_key(i), count) for i in instances})


def decoded_events(records: Iterable[RawRecord], wanted: EventFilter) -> Iterator[HistoryEvent]:
    """The history events among ``records`` that ``wanted`` keeps; unreadable records are
    reported on stderr and skipped (``history verify`` names them as breaks)."""
    for record in records:
        if not wanted.wants_key(record.key):
            continue
        if record.value is None:
            warn(f"empty record at partition {record.partition} offset {record.offset}")
            continue
        try:
            event = decode_history(record.value)
        except CodecError as exc:
            warn(
                f"partition {record.partition} offset {record.offset} is not a readable "
                f"history event ({exc}); run 'history verify' on this instance"
            )
            continue
        if wanted.wants(event):
            yield event


def file_events(paths: Sequence[str], wanted: EventFilter | None = None) -> Iterator[HistoryEvent]:
    """Events from exported Avro container files, in file order."""
    for name in paths:
        path = Path(name)
        try:
            with path.open("rb") as fo:
                for event in read_history_file(fo):
                    if wanted is None or wanted.wants(event):
                        yield event
        except FileNotFoundError:
            raise ConfigurationError(
                f"history file {path} does not exist; check --from-file"
            ) from None
        except (ValueError, EOFError) as exc:
            raise ConfigurationError(
                f"{path} is not an Avro container file of history events ({exc}); export one "
                f"with 'turnstile history export --output {path.name}'"
            ) from exc
