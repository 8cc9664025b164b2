"""``replay check`` and ``audit state``: does the code, and does the engine's state, still
agree with the recorded history?

``replay check`` re-executes workflow code against recorded histories and exits 1 on any
divergence, so it can gate a deploy. ``audit state`` rebuilds every instance's state from
the history topic and compares it with the processor's tables (from the state-changelog
topic, or a stopped replica's RocksDB files) and with the status topic.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from engine.adapters.kafka.history import TopicReader
from engine.adapters.state_files import read_state_rows, replica_partitions
from engine.cli import SubParsers
from engine.cli.audit_io import (
    EXIT_PROBLEMS,
    Progress,
    decoded_events,
    file_events,
    instance_partitions,
    warn,
)
from engine.cli.options import (
    add_module_arguments,
    add_settings_arguments,
    connected_settings,
    require_registered,
    settings_from_args,
)
from engine.cli.worker_cmd import import_modules
from engine.codec import decode_message
from engine.config.settings import Settings
from engine.config.topics import TopicNames, topic_names
from engine.core.errors import CodecError, ConfigurationError
from engine.core.messages import InstanceStatus
from engine.runtime.registry import Registry, default_registry
from engine.services.audit.records import EventFilter
from engine.services.audit.replay import DIVERGED, ERROR, ReplayChecker, ReplayReport
from engine.services.audit.state import (
    AuditReport,
    InstanceFold,
    ProcessorTables,
    compare,
    confirmed,
    fold_histories,
)
from engine.services.watchdog import TurnWatchdog

__all__ = ["register"]

RECHECK_DELAY_S = 1.0


def register(subparsers: SubParsers) -> None:
    """Add ``replay check`` and ``audit state``."""
    _register_replay(subparsers)
    _register_audit(subparsers)


def _group(subparsers: SubParsers, name: str, help: str, description: str) -> SubParsers:
    group = subparsers.add_parser(name, help=help, description=description)
    group.set_defaults(help_parser=group)
    return group.add_subparsers(title="commands", metavar="COMMAND")


def _common(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--list-ok", action="store_true", help="list what is fine too")
    parser.add_argument(
        "--quiet", action="store_true", help="no progress lines on stderr during long reads"
    )


def _partition_flag(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument(
        "--partition",
        dest="partitions",
        type=int,
        action="append",
        default=[],
        metavar="P",
        help=help,
    )


# --- replay check ---------------------------------------------------------------------------


def _register_replay(subparsers: SubParsers) -> None:
    commands = _group(
        subparsers,
        "replay",
        "re-execute workflow code against recorded histories",
        "Replay recorded histories through the current workflow code.",
    )
    check = commands.add_parser(
        "check",
        help="check that the current code makes the recorded decisions",
        description="Re-execute the current workflow code against recorded histories "
        "(whole partitions of the history topic, some instances, or exported files) and "
        "report per instance whether the decisions match, naming the first divergence. "
        "Activities and inline steps are not run: their recorded results are used. Exits 1 "
        "on any divergence or error, so it can gate a deploy.",
    )
    _common(check)
    add_module_arguments(check, "workflows")
    check.add_argument(
        "--registry",
        metavar="MODULE:NAME",
        help="use this Registry object instead of the default registry",
    )
    check.add_argument(
        "--from-file",
        dest="files",
        action="append",
        default=[],
        metavar="FILE",
        help="replay an exported file instead of the topic (repeatable)",
    )
    _partition_flag(check, "replay only this partition of the history topic (repeatable)")
    check.add_argument(
        "--instance",
        dest="instances",
        action="append",
        default=[],
        metavar="ID",
        help="replay only this instance (repeatable)",
    )
    check.add_argument(
        "--skip-unregistered",
        action="store_true",
        help="skip instances of workflows the code does not define (default: an error)",
    )
    check.set_defaults(handler=_replay_check)


def _registry(args: argparse.Namespace, settings: Settings) -> Registry:
    import_modules([*settings.modules, *args.modules])
    registry = default_registry
    if args.registry:
        module, sep, name = args.registry.partition(":")
        if not sep or not module or not name:
            raise ConfigurationError(f"--registry takes MODULE:NAME, got {args.registry!r}")
        import_modules([module])
        found = getattr(sys.modules[module], name, None)
        if not isinstance(found, Registry):
            raise ConfigurationError(f"{args.registry} is not an engine Registry")
        registry = found
    require_registered(registry.workflows(), "workflows")
    return registry


def _replay_check(args: argparse.Namespace) -> int:
    settings = settings_from_args(args) if args.files else connected_settings(args)
    checker = ReplayChecker(
        _registry(args, settings),
        skip_unregistered=args.skip_unregistered,
        watchdog=TurnWatchdog(settings.turn_budget_ms),
    )
    wanted = EventFilter(set(args.instances) or None)
    started = time.perf_counter()
    if args.files:
        checker.feed_all(file_events(args.files, wanted))
    else:
        topic = topic_names(settings.namespace).history
        with TopicReader(settings) as reader:
            partitions = args.partitions or None
            if args.instances and not partitions:
                partitions = instance_partitions(reader, topic, args.instances)
            records = reader.read(topic, partitions, on_progress=Progress(not args.quiet))
            checker.feed_all(decoded_events(records, wanted))
    report = checker.finish()
    missing = set(args.instances) - {r.instance_id for r in report.results}
    if missing or not report.results:
        warn(f"no history found for {', '.join(sorted(missing)) or 'any instance'}")
    _print_replay(args, report, time.perf_counter() - started)
    return 0 if report.ok else EXIT_PROBLEMS


def _print_replay(args: argparse.Namespace, report: ReplayReport, elapsed_s: float) -> None:
    instances = len(report.results)
    rates = {
        "seconds": round(elapsed_s, 6),
        "events_per_second": round(report.events / elapsed_s, 1) if elapsed_s else 0.0,
        "instances_per_second": round(instances / elapsed_s, 1) if elapsed_s else 0.0,
    }
    if args.json:
        print(json.dumps({**report.to_json(), **rates}, indent=2))
        return
    for result in report.results:
        if result.outcome in (DIVERGED, ERROR) or args.list_ok:
            print(result.line())
    verdict = (
        "all decisions match"
        if report.ok
        else f"{report.count('diverged')} diverged, {report.count('error')} errors"
    )
    skipped = report.count("skipped")
    print(
        f"replayed {instances} instances ({report.events} events, {report.generations} "
        f"generations{f', {skipped} skipped' if skipped else ''}) in {elapsed_s:.2f}s: "
        f"{rates['events_per_second']:,.0f} events/s, {rates['instances_per_second']:,.0f} "
        f"instances/s; {verdict}"
    )


# --- audit state ----------------------------------------------------------------------------


def _register_audit(subparsers: SubParsers) -> None:
    commands = _group(
        subparsers,
        "audit",
        "compare the engine's state with its history",
        "Check the engine's derived state against the history topic.",
    )
    state = commands.add_parser(
        "state",
        help="rebuild state from history and compare it with the processor's",
        description="Rebuild every instance's state from the history topic (status, output, "
        "generation, next sequence, last hash, current rows) and compare it with the "
        "processor's tables (from the state-changelog topic, or with --state-dir from a "
        "stopped replica's RocksDB files) and with the status topic. Lists every difference "
        "and exits 1 if there is any. On a running engine, differences are read twice and "
        "only those that persist are reported.",
    )
    _common(state)
    state.add_argument(
        "--state-dir",
        metavar="DIR",
        help="read the processor's tables from this replica state folder instead of the "
        "state-changelog topic (the replica should be stopped)",
    )
    state.add_argument("--replica-id", metavar="ID", help="replica whose files --state-dir reads")
    _partition_flag(state, "audit only this partition (repeatable)")
    state.add_argument(
        "--no-recheck",
        action="store_true",
        help="report differences after one read (do not read again to rule out changes "
        "that happened during the audit)",
    )
    state.set_defaults(handler=_audit_state)


class _StateSources:
    """History, processor tables and status records, read incrementally from the topics."""

    def __init__(self, reader: TopicReader, topics: TopicNames, progress: Progress) -> None:
        self.reader = reader
        self.topics = topics
        self.progress = progress
        self.folds: dict[str, InstanceFold] = {}
        self.tables = ProcessorTables()
        self.statuses: dict[str, InstanceStatus] = {}
        self.from_changelog = True

    def read(self, partitions: Sequence[int] | None, *, more: bool = False) -> None:
        """Read the topics (``more``: from where the previous read stopped)."""
        history = self._records(self.topics.history, partitions, more)
        fold_histories(decoded_events(history, EventFilter()), into=self.folds)
        if self.from_changelog:
            for record in self._records(self.topics.state_changelog, partitions, more):
                if record.key is not None:
                    self.tables.apply(record.key, record.value)
        for record in self._records(self.topics.status, partitions, more):
            self._status(record.key, record.value)

    def _records(self, topic: str, partitions: Sequence[int] | None, more: bool) -> Any:
        start = self.reader.positions.get(topic) if more else None
        return self.reader.read(topic, partitions, start=start, on_progress=self.progress)

    def _status(self, key: bytes | None, value: bytes | None) -> None:
        instance_id = (key or b"").decode("utf-8", "replace")
        if value is None:
            self.statuses.pop(instance_id, None)
            return
        try:
            status = decode_message(value)
        except CodecError as exc:
            warn(f"unreadable status record for {instance_id!r}: {exc}")
            return
        if isinstance(status, InstanceStatus):
            self.statuses[instance_id] = status

    def compare(self) -> AuditReport:
        return compare(self.folds, self.tables, self.statuses)


def _load_files(settings: Settings, sources: _StateSources, wanted: list[int]) -> list[int]:
    """Load a replica's tables from disk; returns the partitions it has (among ``wanted``)."""
    found = replica_partitions(settings.state_dir, settings.namespace, settings.replica_id)
    partitions = [p for p in found if not wanted or p in wanted]
    if not partitions:
        raise ConfigurationError(
            f"replica {settings.replica_id!r} has none of the partitions {wanted} on disk; "
            f"it has {sorted(found)}"
        )
    for partition in partitions:
        for key, value in read_state_rows(found[partition]):
            sources.tables.apply(key, value)
    sources.from_changelog = False
    return partitions


def _audit_state(args: argparse.Namespace) -> int:
    settings = connected_settings(args, replica_id=args.replica_id, state_dir=args.state_dir)
    topics = topic_names(settings.namespace)
    with TopicReader(settings) as reader:
        sources = _StateSources(reader, topics, Progress(not args.quiet))
        partitions: list[int] | None = args.partitions or None
        if args.state_dir:
            partitions = _load_files(settings, sources, args.partitions)
        sources.read(partitions)
        report = sources.compare()
        if not report.ok and not args.no_recheck:
            time.sleep(RECHECK_DELAY_S)
            sources.read(partitions, more=True)
            report = confirmed(report, sources.compare())
    where = "the replica's files" if args.state_dir else "the state changelog"
    _print_audit(args, report, f"{where} and the status topic", partitions)
    return 0 if report.ok else EXIT_PROBLEMS


def _print_audit(
    args: argparse.Namespace, report: AuditReport, against: str, partitions: list[int] | None
) -> None:
    if args.json:
        print(json.dumps({**report.to_json(), "partitions": partitions}, indent=2))
        return
    for difference in report.differences:
        print(f"DIFF  {difference.line()}")
    if args.list_ok:
        for instance_id in report.purged:
            print(f"purged       {instance_id}: history only (purged after it ended)")
        for instance_id in report.not_started:
            print(f"not started  {instance_id}: scheduled or terminated before it started")
    scope = "all partitions" if partitions is None else f"partitions {partitions}"
    verdict = f"{len(report.differences)} differences" if report.differences else "no differences"
    print(
        f"audited {report.instances} instances ({report.events} events, {scope}) against "
        f"{against}: {verdict} ({len(report.purged)} purged, {len(report.not_started)} not "
        f"started)"
    )
