"""``topics apply`` and ``topics check``: keep the cluster's topics as ``topics/topics.toml``
declares them (and the user topics a spec of your own declares, ``--spec``).

``check`` is read-only and exits 1 on any difference, so deploy scripts and CI can gate on
it. ``apply`` creates what is missing, repairs drifted configs only with ``--fix-config``,
and never changes a partition count (it explains what to do instead).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.adapters.kafka import admin as kafka_admin
from engine.adapters.kafka.payload_sweep import sweep_payloads
from engine.cli import SubParsers
from engine.cli.options import add_settings_arguments, connected_settings, settings_from_args
from engine.cli.worker_cmd import import_modules
from engine.config.acls import ROLES, kafka_acls_commands
from engine.config.settings import Settings
from engine.config.topics import Drift, TopicDiff, TopicsSpec, load_spec, with_task_queues
from engine.runtime.registry import default_registry


def register(subparsers: SubParsers) -> None:
    """Add ``topics`` with its ``apply`` and ``check`` sub-commands."""
    topics = subparsers.add_parser(
        "topics",
        help="create and check the engine's Kafka topics (topics/topics.toml)",
        description="Keep the cluster's topics as the declarative spec says.",
    )
    topics.set_defaults(help_parser=topics)
    commands = topics.add_subparsers(title="topics commands", metavar="COMMAND")

    apply = commands.add_parser(
        "apply",
        help="create missing topics (and repair configs with --fix-config)",
        description="Create the topics that are missing. Drifted configs are reported, and "
        "set back to the spec with --fix-config. Partition counts are never changed: a "
        "mismatch stops the command with advice.",
    )
    _add_common(apply)
    apply.add_argument(
        "--fix-config", action="store_true", help="set drifted topic configs back to the spec"
    )
    apply.set_defaults(handler=_apply)

    check = commands.add_parser(
        "check",
        help="report differences between the cluster and the spec (exit 1 on drift)",
        description="Read-only: list missing topics and drifted partition counts, "
        "replication and configs. Exits 0 when all is as declared, 1 otherwise.",
    )
    _add_common(check)
    check.set_defaults(handler=_check)

    acls = commands.add_parser(
        "acls",
        help="print the kafka-acls commands that give a role exactly what it needs",
        description="The ACLs a processor, worker or client uses in this namespace, as "
        "kafka-acls.sh commands ($ADMIN: --bootstrap-server HOST:PORT --command-config "
        "FILE of a principal allowed to create ACLs); a processor's include the user topics "
        "it publishes to and the business topics its triggers read, from its settings. "
        "Connects to nothing.",
    )
    add_settings_arguments(acls)
    acls.add_argument("role", choices=ROLES, help="the engine role")
    acls.add_argument("--principal", required=True, help="its principal, e.g. User:worker")
    acls.set_defaults(handler=_acls)

    sweep = commands.add_parser(
        "sweep-payloads",
        help="delete chunks of large payloads whose instance no longer exists",
        description="Read the status and payloads topics and write a tombstone for every "
        "chunk whose instance has no status (purged, or never started) and that is older "
        "than --older-than: what purge leaves behind (generations before a continue-as-new, "
        "refused starts, results of attempts that died half-way).",
    )
    add_settings_arguments(sweep)
    sweep.add_argument(
        "--older-than",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="leave younger chunks alone: a start on its way has no status yet (3600)",
    )
    sweep.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    sweep.set_defaults(handler=_sweep)


def _add_common(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser)
    group = parser.add_argument_group("topics")
    group.add_argument(
        "--partitions",
        type=int,
        help="partition count of the co-partitioned topics (default: $TURNSTILE_PARTITIONS "
        "or 32); must match existing topics",
    )
    group.add_argument(
        "--replication-factor",
        type=int,
        help="replication factor (default: $TURNSTILE_REPLICATION_FACTOR, or 3 on a cluster "
        "of three or more brokers and 1 otherwise)",
    )
    group.add_argument(
        "--spec",
        metavar="FILE",
        help="topics spec (default: the installed topics.toml); the [user-topics] it declares "
        "(topics workflows publish to, trigger topics) are created and checked too",
    )
    group.add_argument(
        "--task-queue",
        action="append",
        dest="task_queues",
        default=[],
        metavar="QUEUE",
        help="also the topic of this task queue, <namespace>.activity-tasks.QUEUE, declared "
        "like activity-tasks (repeatable; workers and processors also create it on first use)",
    )
    group.add_argument(
        "-m",
        "--module",
        dest="modules",
        action="append",
        default=[],
        metavar="MODULE",
        help="also the topics of the task queues that this module's activities name "
        "(imported like run worker's --module; repeatable)",
    )
    group.add_argument("--json", action="store_true", help="print one JSON object")
    group.add_argument(
        "--timeout", type=float, default=kafka_admin.DEFAULT_TIMEOUT, help="seconds per request"
    )


def declared_spec(path: str | None, task_queues: list[str], modules: list[str]) -> TopicsSpec:
    """The spec with the named task queues' topics and those of the queues that the
    activities of ``modules`` register with: what ``topics apply`` creates."""
    queues = list(task_queues)
    if modules:
        import_modules(modules)
        queues += default_registry.task_queues()
    return with_task_queues(load_spec(path), queues)


def _inputs(args: argparse.Namespace) -> tuple[TopicsSpec, Settings]:
    spec = declared_spec(args.spec, args.task_queues, args.modules)
    settings = connected_settings(
        args,
        within_s=args.timeout,
        partitions=args.partitions,
        replication_factor=args.replication_factor,
    )
    return spec, settings


def _acls(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    lines = kafka_acls_commands(
        settings.namespace,
        args.role,
        args.principal,
        publish_topics=settings.publish_topics,
        trigger_topics=[trigger.topic for trigger in settings.triggers],
    )
    print("\n".join(lines))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    settings = connected_settings(args)
    found = sweep_payloads(settings, grace_ms=int(args.older_than * 1000), dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    print(
        f"{found.chunks} chunks on the payloads topic; {verb} {found.orphans} orphaned "
        f"chunks of {found.owners} instances"
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    spec, settings = _inputs(args)
    diff = kafka_admin.check(spec, settings, timeout=args.timeout)
    _report(args, settings, diff)
    return 0 if diff.clean else 1


def _apply(args: argparse.Namespace) -> int:
    spec, settings = _inputs(args)
    admin = kafka_admin.admin_for(settings)
    before = kafka_admin.check(spec, settings, admin, timeout=args.timeout)
    if before.blocking:
        _report(args, settings, before, refused=True)
        return 1
    result = kafka_admin.apply(
        spec, settings, fix_config=args.fix_config, admin=admin, timeout=args.timeout
    )
    _report(args, settings, result.remaining, created=result.created, altered=result.altered)
    return 0 if result.remaining.clean else 1


def _report(
    args: argparse.Namespace,
    settings: Settings,
    diff: TopicDiff,
    *,
    refused: bool = False,
    created: tuple[str, ...] = (),
    altered: tuple[Drift, ...] = (),
) -> None:
    drifts = diff.all_drifts()
    if args.json:
        document: dict[str, Any] = {
            "bootstrap_servers": settings.bootstrap_servers,
            "namespace": settings.namespace,
            "clean": diff.clean,
            "refused": refused,
            "created": list(created),
            "altered": [d.to_json() for d in altered],
            "drift": [d.to_json() for d in drifts],
        }
        print(json.dumps(document, indent=2))
        return
    for name in created:
        print(f"created  {name}")
    for drift in altered:
        print(f"altered  {drift.topic}: {drift.key} = {drift.expected} (was {drift.actual!r})")
    for drift in drifts:
        print(f"{drift.kind:<12} {drift.topic}: {drift.detail}")
    if refused:
        print("refused: nothing was changed; see the advice above.", file=sys.stderr)
    elif diff.of_kind("config"):
        print("config drift: set it back to the spec with 'topics apply --fix-config'.")
    if diff.clean:
        print(f"topics of namespace {settings.namespace!r} are as declared.")
