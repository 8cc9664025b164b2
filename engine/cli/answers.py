"""What the commands that the processor answers share: the flags that make a retry safe and
bound the wait, the client they send with, and the line that reports the answer."""

from __future__ import annotations

import argparse

from engine.cli.options import connected_settings
from engine.client import Client
from engine.core.messages import CommandOutcome


def not_negative(text: str) -> float:
    """A number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return value


def add_answer_flags(parser: argparse.ArgumentParser, *, no_wait: bool = True) -> None:
    """``--request-id`` and ``--timeout`` (and ``--no-wait`` where sending without waiting
    for the answer makes sense)."""
    parser.add_argument(
        "--request-id", help="makes a retry safe: the same id is applied once (default: new)"
    )
    if no_wait:
        parser.add_argument(
            "--no-wait",
            dest="wait_answer",
            action="store_false",
            help="do not wait for the processor's answer (bulk scripts)",
        )
    parser.add_argument(
        "--timeout",
        type=not_negative,
        default=30.0,
        help="seconds to wait for the processor's answer (30)",
    )


def answering_client(args: argparse.Namespace) -> Client:
    """A client that sends commands and waits for their answers (no status view)."""
    timeout = getattr(args, "timeout", 30.0)
    return Client.from_settings(connected_settings(args), read_status=False, timeout=timeout)


def print_answer(outcome: CommandOutcome | None, *, with_id: bool = False) -> int:
    """One line for an answered command (nothing with --no-wait); exit status 0. Refusals
    never get here: they raise, and the CLI maps them to exit code 4."""
    if outcome is not None:
        who = f" {outcome.instance_id}" if with_id else ""
        why = f": {outcome.reason}" if outcome.reason else ""
        duplicate = " (a repeated request, applied once)" if outcome.duplicate else ""
        print(f"{outcome.result.value}{who}{why}{duplicate}")
    return 0
