"""``history show``, ``history export`` and ``history verify``: the history topic as an
audit record that people can read, tools can load, and anyone can check for tampering.

Everything is read with read_committed from explicit partitions (no consumer group, no
committed offsets): auditing never changes what it audits.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from engine.adapters.kafka.history import ReadEnd, TopicReader
from engine.cli import SubParsers
from engine.cli.audit_io import (
    EXIT_PROBLEMS,
    Progress,
    decoded_events,
    file_events,
    instance_partitions,
    iso_time_ms,
)
from engine.cli.options import add_settings_arguments, connected_settings
from engine.codec import write_history_file
from engine.config.topics import topic_names
from engine.core.errors import ConfigurationError, InstanceNotFoundError
from engine.core.history import HistoryEvent
from engine.services.audit.chain import ChainResult, ChainVerifier, verify_events
from engine.services.audit.records import EventFilter
from engine.services.audit.timeline import HEADER, format_time, timeline_json, timeline_lines

__all__ = ["register"]


def register(subparsers: SubParsers) -> None:
    """Add the ``history`` command group."""
    history = subparsers.add_parser(
        "history",
        help="show, export and verify instance histories",
        description="Read the history topic (the engine's audit record): an instance's "
        "timeline, exports to Avro container files, and hash-chain verification.",
    )
    history.set_defaults(help_parser=history)
    commands = history.add_subparsers(title="commands", metavar="COMMAND")
    _register_show(commands)
    _register_export(commands)
    _register_verify(commands)


def _command(commands: SubParsers, name: str, help: str, description: str) -> Any:
    parser = commands.add_parser(name, help=help, description=description)
    add_settings_arguments(parser)
    parser.add_argument(
        "--quiet", action="store_true", help="no progress lines on stderr during long reads"
    )
    return parser


# --- show -----------------------------------------------------------------------------------


def _register_show(commands: SubParsers) -> None:
    show = _command(
        commands,
        "show",
        "print an instance's timeline",
        "Print every event of an instance, across its generations, one line per event: "
        "sequence, time (UTC), generation, event and its salient fields (payloads as JSON).",
    )
    show.add_argument("instance", help="instance id")
    show.add_argument("--json", action="store_true", help="print the events as JSON")
    show.add_argument("--width", type=int, default=80, help="cut values longer than this (80)")
    show.add_argument("--full", action="store_true", help="never cut values")
    show.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
    settings = connected_settings(args)
    topic = topic_names(settings.namespace).history
    with TopicReader(settings, end=ReadEnd.LAST_STABLE) as reader:  # answers however busy
        partition = reader.partition_of(topic, args.instance)
        records = reader.read(topic, [partition], on_progress=Progress(not args.quiet))
        events = list(decoded_events(records, EventFilter(instances={args.instance})))
    if not events:
        raise InstanceNotFoundError(
            f"no history for instance {args.instance!r} on {topic} (partition {partition}); "
            f"check the id and --namespace (a scheduled start has no history until it runs)"
        )
    if args.json:
        print(json.dumps(timeline_json(args.instance, events, partition), indent=2))
    else:
        print(HEADER)
        for line in timeline_lines(events, 0 if args.full else args.width):
            print(line)
    return 0


# --- export ---------------------------------------------------------------------------------


def _register_export(commands: SubParsers) -> None:
    export = _command(
        commands,
        "export",
        "write histories to an Avro container file",
        "Write history events to an Avro object container file with the HistoryEvent "
        "schema (Spark, DuckDB, avro-tools... read it). Select instances with --instance, a "
        "time range with --since/--until (on the events' own timestamps), or neither for "
        "everything. 'history verify --from-file' and 'replay check --from-file' read it.",
    )
    export.add_argument("-o", "--output", required=True, metavar="FILE", help="file to write")
    export.add_argument(
        "--instance",
        dest="instances",
        action="append",
        default=[],
        metavar="ID",
        help="export this instance (repeatable)",
    )
    export.add_argument(
        "--since", type=iso_time_ms, metavar="TIME", help="events at or after this ISO time"
    )
    export.add_argument(
        "--until", type=iso_time_ms, metavar="TIME", help="events before this ISO time"
    )
    export.add_argument(
        "--codec",
        choices=["deflate", "null"],
        default="deflate",
        help="block compression of the file (deflate)",
    )
    export.add_argument("--json", action="store_true", help="print the summary as JSON")
    export.set_defaults(handler=_export)


class _Tally:
    """Counts what passes through, for the export summary."""

    def __init__(self, events: Iterable[HistoryEvent]) -> None:
        self._events = events
        self.instances: set[str] = set()

    def __iter__(self) -> Iterator[HistoryEvent]:
        for event in self._events:
            self.instances.add(event.instance_id)
            yield event


def _write_atomically(path: Path, events: Iterable[HistoryEvent], codec: str) -> int:
    """Write to a side file and rename it, so a failed export leaves no half-written file."""
    partial = path.with_name(path.name + ".partial")
    try:
        with partial.open("wb") as fo:
            written = write_history_file(fo, events, codec=codec)
        os.replace(partial, path)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot write {path}: {exc.strerror or exc}; check --output (its folder must "
            f"exist and be writable)"
        ) from exc
    finally:
        partial.unlink(missing_ok=True)
    return written


def _export(args: argparse.Namespace) -> int:
    if args.since is not None and args.until is not None and args.since >= args.until:
        raise ConfigurationError("--since must be before --until")
    settings = connected_settings(args)
    topic = topic_names(settings.namespace).history
    wanted = EventFilter(set(args.instances) or None, args.since, args.until)
    with TopicReader(settings) as reader:
        partitions = instance_partitions(reader, topic, args.instances) if args.instances else None
        records = reader.read(
            topic, partitions, since_ms=args.since, on_progress=Progress(not args.quiet)
        )
        tally = _Tally(decoded_events(records, wanted))
        written = _write_atomically(Path(args.output), tally, args.codec)
    summary = {
        "file": str(args.output),
        "events": written,
        "instances": len(tally.instances),
        "since": None if args.since is None else format_time(args.since),
        "until": None if args.until is None else format_time(args.until),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"wrote {written} events of {len(tally.instances)} instances to {args.output}")
    return 0


# --- verify ---------------------------------------------------------------------------------


def _register_verify(commands: SubParsers) -> None:
    verify = _command(
        commands,
        "verify",
        "check the hash chains of histories",
        "Recompute each instance's hash chain and name the first broken link (instance, "
        "sequence, and whether an event was altered, is missing, reordered or duplicated). "
        "Exits 1 if any chain is broken.",
    )
    verify.add_argument("instances", nargs="*", metavar="ID", help="instances to verify")
    verify.add_argument("--all", action="store_true", help="verify every instance on the topic")
    verify.add_argument(
        "--from-file",
        dest="files",
        action="append",
        default=[],
        metavar="FILE",
        help="verify an exported file instead of the topic (repeatable)",
    )
    verify.add_argument(
        "--partial",
        action="store_true",
        help="accept chains that start after sequence 0 (exports of a time range)",
    )
    verify.add_argument("--list-ok", action="store_true", help="list intact chains too")
    verify.add_argument("--json", action="store_true", help="print the results as JSON")
    verify.set_defaults(handler=_verify)


def _verify(args: argparse.Namespace) -> int:
    if not (args.instances or args.all or args.files):
        raise ConfigurationError(
            "say what to verify: instance ids, --all (every instance on the topic), or "
            "--from-file FILE (an export)"
        )
    wanted = EventFilter(set(args.instances) or None)
    if args.files:
        results = verify_events(file_events(args.files, wanted), partial=args.partial)
    else:
        results = _verify_topic(args, wanted)
    missing = sorted(set(args.instances) - {r.instance_id for r in results})
    _print_verdicts(args, results, missing)
    return 0 if all(r.ok for r in results) and not missing else EXIT_PROBLEMS


def _verify_topic(args: argparse.Namespace, wanted: EventFilter) -> list[ChainResult]:
    settings = connected_settings(args)
    topic = topic_names(settings.namespace).history
    verifier = ChainVerifier(partial=args.partial)
    with TopicReader(settings) as reader:
        partitions = None if args.all else instance_partitions(reader, topic, args.instances)
        for record in reader.read(topic, partitions, on_progress=Progress(not args.quiet)):
            if wanted.wants_key(record.key):
                key = None if record.key is None else record.key.decode("utf-8", "replace")
                verifier.feed(record.value or b"", key)
    return verifier.results()


def _print_verdicts(
    args: argparse.Namespace, results: list[ChainResult], missing: list[str]
) -> None:
    broken = [r for r in results if not r.ok]
    events = sum(r.events for r in results)
    if args.json:
        doc = {
            "ok": not broken and not missing,
            "instances": len(results),
            "events": events,
            "broken": len(broken),
            "not_found": missing,
            "results": [r.to_json() for r in results],
        }
        print(json.dumps(doc, indent=2))
        return
    for result in results:
        if result.broken is not None:
            b = result.broken
            print(f"BROKEN  {b.instance_id}: #{b.sequence} {b.kind}: {b.detail}")
        elif args.list_ok or args.instances:
            print(
                f"ok      {result.instance_id}: {result.events} events "
                f"(#{result.first_sequence}..#{result.last_sequence}), "
                f"last hash {result.last_hash.hex()[:16]}"
                + (f", started over {result.restarts}x after a purge" if result.restarts else "")
            )
    for instance_id in missing:
        print(f"MISSING {instance_id}: no history found")
    verdict = f"{len(broken)} broken" if broken else "all chains intact"
    print(f"verified {len(results)} instances, {events} events: {verdict}")
