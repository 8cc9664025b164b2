"""``turnstile activity complete|fail|heartbeat TOKEN``: finish or heartbeat an activity
attempt that completes later (``activity.info().complete_later()``) from a shell, by its
task token.

The client reads the status topic first, so a token of an unknown or ended instance is
refused (exit 1) before anything is written; see ``engine.services.client.completions``.
A heartbeat is also answered by the processor, which refuses one for an attempt it no
longer waits for (exit 4).
"""

from __future__ import annotations

import argparse

from engine.cli import SubParsers
from engine.cli.answers import not_negative
from engine.cli.options import add_settings_arguments, connected_settings, json_value
from engine.client import Client

__all__ = ["register"]


def register(subparsers: SubParsers) -> None:
    """Add ``activity`` with its ``complete``, ``fail`` and ``heartbeat`` sub-commands."""
    activity = subparsers.add_parser(
        "activity",
        help="finish or heartbeat an activity attempt that completes later, by its task token",
        description="Finish an activity attempt whose body called complete_later(), as "
        "its worker would have: with a result, or failed (its retry policy decides); or "
        "heartbeat it, which keeps its heartbeat timeout from firing.",
    )
    activity.set_defaults(help_parser=activity)
    commands = activity.add_subparsers(title="activity commands", metavar="COMMAND")
    complete = _token_command(commands, "complete", "complete the attempt with a result")
    complete.add_argument(
        "--result", type=json_value, default=None, help="the activity's result as JSON (null)"
    )
    complete.set_defaults(handler=_complete)
    fail = _token_command(commands, "fail", "fail the attempt (the retry policy decides)")
    fail.add_argument("--error", required=True, help="why it failed (recorded as the failure)")
    fail.add_argument(
        "--non-retryable", action="store_true", help="fail the call without retrying it"
    )
    fail.set_defaults(handler=_fail)
    beat = _token_command(commands, "heartbeat", "heartbeat the attempt (and keep details)")
    beat.add_argument(
        "--details",
        type=json_value,
        default=None,
        help="progress details as JSON, given to the next attempt if this one fails",
    )
    beat.set_defaults(handler=_heartbeat)


def _token_command(commands: SubParsers, name: str, help: str) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=help, description=help)
    add_settings_arguments(parser)
    parser.add_argument("token", metavar="TOKEN", help="the task token the activity handed out")
    parser.add_argument(
        "--timeout",
        type=not_negative,
        default=30.0,
        help="seconds to wait for the status view and the write (30)",
    )
    return parser


def _client(args: argparse.Namespace) -> Client:
    return Client.from_settings(connected_settings(args), timeout=args.timeout)


def _complete(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.complete_activity(args.token, args.result)
    print("completed")
    return 0


class _Failed(Exception):
    """The failure ``turnstile activity fail`` reports (its message is ``--error``)."""

    type = "ActivityFailed"

    def __init__(self, message: str, non_retryable: bool) -> None:
        super().__init__(message)
        self.non_retryable = non_retryable


def _fail(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.fail_activity(args.token, _Failed(args.error, args.non_retryable))
    print("failed")
    return 0


def _heartbeat(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.heartbeat_activity(args.token, args.details)
    print("heartbeat accepted")
    return 0
