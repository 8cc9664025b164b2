"""``schedule`` commands: create, pause, resume, delete, trigger, list and describe.

The definition is checked while the arguments are parsed (a bad cron expression, a bad
duration, a name run ids cannot hold), so a mistake is an argparse error before Kafka is
even asked. Every command waits for the processor's answer and prints it; a refusal (a
name that exists, or that names no schedule) exits 4 with the reason, as the instance
commands do.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from engine.cli import SubParsers
from engine.cli.answers import add_answer_flags, answering_client, print_answer
from engine.cli.options import (
    add_command,
    connected_settings,
    iso_time,
    json_value,
)
from engine.client import Client
from engine.core.cron import parse_cron
from engine.core.errors import ScheduleSpecError
from engine.core.schedules import OverlapPolicy, check_name, parse_duration
from engine.services.time_zones import resolve_zone

__all__ = ["register"]

EXIT_NOT_FOUND = 1


def register(subparsers: SubParsers) -> None:
    """Add ``schedule`` and its sub-commands."""
    schedule = subparsers.add_parser(
        "schedule",
        help="start a workflow on a cron expression or an interval",
        description="Schedules live in the engine (a row on its partition, driven by "
        "durable timers): each fire time starts exactly one run, with the id NAME/<fire time>.",
    )
    schedule.set_defaults(help_parser=schedule)
    commands = schedule.add_subparsers(title="schedule commands", metavar="COMMAND")
    _register_create(commands)
    for name, help, handler in _SIMPLE:
        parser = add_command(commands, name, help, handler)
        parser.add_argument("name", metavar="NAME", type=_name, help="schedule name")
        if name == "pause":
            parser.add_argument("--reason", default="", help="kept with the schedule")
        add_answer_flags(parser, no_wait=False)
    listing = add_command(commands, "list", "list the schedules", _list)
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    describe = add_command(commands, "describe", "show a schedule and its counters", _describe)
    describe.add_argument("name", metavar="NAME", type=_name, help="schedule name")


# --- argument types -------------------------------------------------------------------------


def _checked(check: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return check(text)
        except ScheduleSpecError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


_name = _checked(check_name)


def _cron(text: str) -> str:
    parse_cron(text)
    return text


def _timezone(text: str) -> str:
    resolve_zone(text)
    return text


def _duration(what: str) -> Callable[[str], Any]:
    return _checked(lambda text: parse_duration(text, what) / 1000)


# --- create ---------------------------------------------------------------------------------


def _register_create(commands: SubParsers) -> None:
    create = add_command(commands, "create", "create a schedule", _create)
    create.add_argument("name", metavar="NAME", type=_name, help="schedule name")
    when = create.add_mutually_exclusive_group(required=True)
    when.add_argument(
        "--cron",
        type=_checked(_cron),
        help="five-field cron expression, e.g. '*/5 * * * *' (in --timezone)",
    )
    when.add_argument("--every", type=_duration("the interval"), help="interval, e.g. 30s, 5m, 1h")
    create.add_argument("--workflow", required=True, help="registered workflow name")
    create.add_argument("--version", default="", help="workflow version (default: the only one)")
    create.add_argument("--input", type=json_value, help="workflow input as JSON")
    create.add_argument(
        "--overlap",
        type=str.upper,
        choices=[p.value for p in OverlapPolicy],
        default=OverlapPolicy.SKIP.value,
        help="what a fire time does while the previous run still runs (default SKIP)",
    )
    create.add_argument(
        "--catch-up-window",
        type=_duration("the catch-up window"),
        default=3600.0,
        help="after downtime, missed fire times younger than this still run (default 1h)",
    )
    create.add_argument("--start-at", type=iso_time, help="no fire time before this ISO 8601 time")
    create.add_argument("--end-at", type=iso_time, help="no fire time after this ISO 8601 time")
    create.add_argument(
        "--timezone",
        type=_checked(_timezone),
        default="UTC",
        help="IANA time zone the cron expression reads, e.g. Europe/Paris (default UTC); a "
        "time a DST change skips has no run that day, one it repeats runs twice",
    )
    add_answer_flags(create, no_wait=False)


def _create(args: argparse.Namespace) -> int:
    with answering_client(args) as client:
        answer = client.create_schedule(
            args.name,
            args.workflow,
            args.input,
            cron=args.cron,
            every=args.every,
            version=args.version,
            overlap=args.overlap,
            catch_up_window=args.catch_up_window,
            start_at=args.start_at,
            end_at=args.end_at,
            timezone=args.timezone,
            request_id=args.request_id,
        )
    return print_answer(answer)


# --- pause, resume, delete, trigger -----------------------------------------------------------


def _pause(args: argparse.Namespace) -> int:
    with answering_client(args) as client:
        return print_answer(
            client.pause_schedule(args.name, args.reason, request_id=args.request_id)
        )


def _op(method: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        with answering_client(args) as client:
            answer = getattr(client, method)(args.name, request_id=args.request_id)
        return print_answer(answer)

    return run


_SIMPLE: tuple[tuple[str, str, Callable[[argparse.Namespace], int]], ...] = (
    ("pause", "pause a schedule: no fire time starts a run until resumed", _pause),
    ("resume", "resume a paused schedule from its next fire time", _op("resume_schedule")),
    ("delete", "delete a schedule (the runs it started go on)", _op("delete_schedule")),
    ("trigger", "start a run now, under the overlap policy", _op("trigger_schedule")),
)


# --- list, describe ---------------------------------------------------------------------------


def _list(args: argparse.Namespace) -> int:
    with Client.from_settings(connected_settings(args)) as client:
        found = client.list_schedules()
    if args.json:
        print(json.dumps(found, indent=2, default=str))
        return 0
    if not found:
        print("no schedules")
    for d in found:
        when = d["cron"] or f"every {d['every_ms'] / 1000:g}s"
        if d.get("timezone", "UTC") != "UTC":
            when = f"{when} {d['timezone']}"
        print(
            f"{d['name']:<24} {d['state']:<7} {when:<20} {d['workflow']:<20} "
            f"started {d['started']}, next {_time(d['next_fire_ms'])}"
        )
    return 0


def _describe(args: argparse.Namespace) -> int:
    with Client.from_settings(connected_settings(args)) as client:
        found = client.describe_schedule(args.name)
    if found is None:
        print(f"no schedule {args.name!r} (see 'turnstile schedule list')")
        return EXIT_NOT_FOUND
    for key in ("next_fire_ms", "last_fire_ms", "created_ms", "start_at_ms", "end_at_ms"):
        found[key.removesuffix("_ms")] = _time(found.pop(key))
    print(json.dumps(found, indent=2, default=str))
    return 0


def _time(ms: int) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")
