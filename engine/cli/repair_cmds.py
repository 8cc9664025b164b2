"""Repair commands: ``reset``, ``rerun`` and ``bulk``.

``reset`` and ``rerun`` send one ``ResetWorkflow`` command and print the processor's answer
(a refusal exits 4 with the reason, like every command). ``bulk`` applies one command to
every instance a filter matches (``engine.services.client.bulk``): progress on stderr, a summary
of the answers on stdout, exit 124 when some answers did not arrive in time.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path

from engine.adapters.status_scan import StatusFold, fold_status_topic
from engine.cli import SubParsers
from engine.cli.answers import answering_client, print_answer
from engine.cli.options import (
    add_settings_arguments,
    add_tag_filter,
    connected_settings,
)
from engine.client import Client
from engine.core.history import RuntimeStatus
from engine.core.messages import ResetTarget
from engine.services.client.bulk import OPERATIONS, BulkFilter, BulkJob, JobSpec, PositionFile

__all__ = ["register"]

EXIT_TIMEOUT = 124
_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(subparsers: SubParsers) -> None:
    """Add the repair commands."""
    _register_reset(subparsers)
    _register_bulk(subparsers)


# --- argument types ---------------------------------------------------------------------------


def _sequence(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected an event's sequence number (0 or more), got {text!r}; "
            f"'turnstile history show ID' lists them"
        )
    return int(text)


@dataclass(frozen=True, slots=True)
class _Moment:
    """A time option: absolute (epoch ms) or a duration before the job's start."""

    epoch_ms: int | None = None
    ago_ms: int = 0

    def resolve(self, now_ms: int) -> int:
        return self.epoch_ms if self.epoch_ms is not None else now_ms - self.ago_ms


def _moment(text: str) -> _Moment:
    """An ISO 8601 time (UTC unless it says otherwise) or a duration ago (30m, 2h, 7d)."""
    ago = _AGO.match(text)
    if ago:
        return _Moment(ago_ms=int(float(ago.group(1)) * _UNITS[ago.group(2)] * 1000))
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time (2026-01-31T12:00) or a duration ago (30m, 2h, 7d), "
            f"got {text!r}"
        ) from None
    when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    return _Moment(int(when.timestamp() * 1000))


def _rate(text: str) -> float:
    number = text[:-2] if text.endswith("/s") else text
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a rate like 50/s, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}")
    return value


# --- reset and rerun ---------------------------------------------------------------------------


def _add_point(parser: argparse.ArgumentParser, required: bool) -> None:
    point = parser.add_mutually_exclusive_group(required=required)
    point.add_argument(
        "--to", type=_sequence, metavar="SEQ", help="the event the new run starts from"
    )
    point.add_argument(
        "--to-last-failure",
        dest="target",
        action="store_const",
        const=ResetTarget.LAST_FAILURE,
        help="start from the run's last failure (a failed activity runs again)",
    )
    point.add_argument(
        "--to-first-turn",
        dest="target",
        action="store_const",
        const=ResetTarget.FIRST_TURN,
        help="start from the first turn: only the start is kept",
    )


def _add_common(parser: argparse.ArgumentParser, reason_required: bool) -> None:
    parser.add_argument(
        "--reason", required=reason_required, default="", help="recorded in the history"
    )
    parser.add_argument(
        "--request-id", help="makes a retry safe: the same id is applied once (default: new)"
    )
    parser.add_argument(
        "--timeout", type=_seconds, default=30.0, help="seconds to wait for the answer (30)"
    )


def _register_reset(subparsers: SubParsers) -> None:
    help = "start a new run of an instance from its history up to a point, and run on from there"
    reset = subparsers.add_parser("reset", help=help, description=help)
    add_settings_arguments(reset)
    reset.add_argument("instance_id", metavar="INSTANCE", help="instance id")
    _add_point(reset, required=True)
    _add_common(reset, reason_required=True)
    reset.set_defaults(handler=_reset)
    help = "run an instance's history up to a point again as a new instance"
    rerun = subparsers.add_parser("rerun", help=help, description=help)
    add_settings_arguments(rerun)
    rerun.add_argument("instance_id", metavar="INSTANCE", help="the instance to copy")
    rerun.add_argument("--new-id", required=True, help="the new instance's id")
    _add_point(rerun, required=False)
    _add_common(rerun, reason_required=False)
    rerun.set_defaults(handler=_rerun)


def _point(args: argparse.Namespace) -> int | ResetTarget:
    if args.to is not None:
        return int(args.to)
    target: ResetTarget | None = args.target
    return target if target is not None else ResetTarget.FIRST_TURN


def _reset(args: argparse.Namespace) -> int:
    with answering_client(args) as client:
        answer = client.reset(
            args.instance_id, _point(args), args.reason, request_id=args.request_id
        )
    return print_answer(answer, with_id=True)


def _rerun(args: argparse.Namespace) -> int:
    with answering_client(args) as client:
        answer = client.rerun(
            args.instance_id, args.new_id, _point(args), args.reason, request_id=args.request_id
        )
    return print_answer(answer, with_id=True)


# --- bulk --------------------------------------------------------------------------------------


def _register_bulk(subparsers: SubParsers) -> None:
    help = "apply one command to every instance a filter matches (resumable, rate-limited)"
    parser = subparsers.add_parser("bulk", help=help, description=help)
    add_settings_arguments(parser)
    parser.add_argument("operation", choices=sorted(OPERATIONS), help="the command to send")
    _add_filters(parser)
    parser.add_argument("--reason", default="", help="recorded in each instance's history")
    point = parser.add_mutually_exclusive_group()
    for flag, target in (
        ("--to-last-failure", ResetTarget.LAST_FAILURE),
        ("--to-first-turn", ResetTarget.FIRST_TURN),
    ):
        point.add_argument(
            flag, dest="reset_to", action="store_const", const=target.value, help="for reset"
        )
    parser.add_argument("--dry-run", action="store_true", help="count the matches, send nothing")
    parser.add_argument("--rate", type=_rate, default=0.0, help="at most N commands a second (N/s)")
    parser.add_argument(
        "--job-id",
        help="names the job: the same id resumes it after a crash (default: a new one)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".turnstile-bulk"),
        help="where job positions are kept (./.turnstile-bulk)",
    )
    parser.add_argument(
        "--timeout", type=_seconds, default=60.0, help="seconds to wait for the answers (60)"
    )
    parser.set_defaults(handler=_bulk)


def _add_filters(parser: argparse.ArgumentParser) -> None:
    """The filter options; each adds one criterion of ``BulkFilter``."""
    parser.add_argument(
        "--status",
        type=str.upper,
        action="append",
        choices=[s.value for s in RuntimeStatus],
        help="only instances in this status (repeatable)",
    )
    parser.add_argument("--name", default="", help="only instances of this workflow")
    parser.add_argument("--version", help="only instances running this version")
    add_tag_filter(parser)
    for flag, what in (
        ("--created-before", "created before"),
        ("--created-after", "created after"),
        ("--ended-before", "ended before"),
        ("--ended-after", "ended after"),
    ):
        parser.add_argument(
            flag, type=_moment, metavar="TIME", help=f"only instances {what} TIME (ISO, or 2h ago)"
        )


def _filter(args: argparse.Namespace, now_ms: int) -> BulkFilter:
    """The filter the options give; relative times count back from ``now_ms``."""

    def at(moment: _Moment | None) -> int | None:
        return None if moment is None else moment.resolve(now_ms)

    return BulkFilter(
        statuses=tuple(RuntimeStatus(s) for s in args.status or ()),
        name=args.name,
        version=args.version,
        tags=tuple(sorted(args.tag)),
        created_before=at(args.created_before),
        created_after=at(args.created_after),
        ended_before=at(args.ended_before),
        ended_after=at(args.ended_after),
    )


def _bulk(args: argparse.Namespace) -> int:
    job_id = args.job_id or f"{args.operation}-{time.strftime('%Y%m%dT%H%M%S')}"
    position = PositionFile(args.state_dir, job_id)
    saved = None if args.dry_run else position.load()
    # a resumed job resolves "7d" against its own start, so it matches what it matched
    now_ms = saved.started_ms if saved is not None else int(time.time() * 1000)
    reset_to = args.reset_to or ResetTarget.LAST_FAILURE.value
    spec = JobSpec(args.operation, _filter(args, now_ms), args.reason, reset_to)
    settings = connected_settings(args)
    # The status topic folded on disk, read back in instance-id order: the job holds one
    # status at a time, however many instances the namespace has (as `list` does).
    with (
        StatusFold.temporary() as fold,
        Client.from_settings(settings, timeout=args.timeout) as client,
    ):
        fold_status_topic(settings, fold)
        statuses = fold.statuses()
        if args.dry_run:
            return _dry_run(args.operation, spec.filter.scan(statuses))
        print(f"bulk {args.operation} {job_id}: position in {position.path}", file=sys.stderr)
        job = BulkJob(
            job_id,
            spec,
            client,
            position,
            started_ms=now_ms,
            rate=args.rate,
            progress=sys.stderr,
        )
        summary = job.run(statuses, args.timeout)
    for line in summary.lines():
        print(line)
    return EXIT_TIMEOUT if summary.timed_out else 0


def _dry_run(operation: str, ids: Iterator[str]) -> int:
    """Count the matches, keeping only the first ten to show."""
    shown = list(islice(ids, 10))
    more = sum(1 for _ in ids)
    print(f"{len(shown) + more} instances match; a run would send {operation} to each")
    for instance_id in shown:
        print(f"  {instance_id}")
    if more:
        print(f"  ... {more} more")
    return 0
