"""Entry point of the ``turnstile`` / ``python -m engine`` command line.

Commands live in small modules, each exposing ``register(subparsers)``; adding a command is
adding its module to :data:`COMMAND_MODULES`. Handlers are attached with
``set_defaults(handler=...)`` and return a process exit code.

Exit codes shared by every command: 0 success, 1 an engine error (the message says what to
do), 2 bad usage, 69 Kafka unreachable within the connect timeout, 130 interrupted. ``wait``
and ``start --wait`` add 124 (timed out); ``dev kafka status`` uses 3 for "not running";
``history verify``, ``replay check`` and ``audit state`` use 1 for "problems found".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

from engine import __version__
from engine.cli import (
    SubParsers,
    activity_cmds,
    audit_cmds,
    client_cmds,
    demo,
    dev,
    history_cmds,
    processor_cmd,
    repair_cmds,
    schedule_cmds,
    topics,
    ui_cmd,
    versions_cmd,
    worker_cmd,
)
from engine.cli.traces import process_tracing
from engine.core.errors import (
    BrokerUnreachableError,
    CommandRefusedError,
    CommandTimeoutError,
    TurnstileError,
)

CommandHandler = Callable[[argparse.Namespace], int]

EXIT_ERROR = 1
EXIT_UNREACHABLE = 69  # EX_UNAVAILABLE of sysexits(3)
EXIT_REFUSED = 4  # the processor refused the command
EXIT_NO_ANSWER = 124  # like timeout(1): the command was sent, no answer came in time
EXIT_INTERRUPTED = 130


class CommandModule(Protocol):
    """What a command module provides: a function that adds its sub-commands."""

    def register(self, subparsers: SubParsers) -> None:
        """Add this module's commands to ``subparsers``."""


COMMAND_MODULES: tuple[CommandModule, ...] = (
    demo,
    processor_cmd,
    worker_cmd,
    client_cmds,
    activity_cmds,
    versions_cmd,
    schedule_cmds,
    repair_cmds,
    topics,
    dev,
    history_cmds,
    audit_cmds,
    ui_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with every registered command module's commands."""
    parser = argparse.ArgumentParser(
        prog="turnstile",
        description="Turnstile: a durable workflow engine for Python, event-sourced on Kafka.",
        epilog=(
            "Every command has --help. The documentation (tutorial, guides, reference) is "
            "docs/ of the source tree; from a checkout, '.venv/bin/mkdocs serve' serves it "
            "on http://127.0.0.1:8000."
        ),
    )
    parser.add_argument("--version", action="version", version=f"turnstile {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show the Kafka client's own warnings (librdkafka)",
    )
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the command, return its exit code.

    Engine errors are printed as one clear message (they say what to do next) rather than
    a traceback; anything else is a bug and keeps its traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose:
        from engine.adapters.kafka.logs import show_librdkafka_logs

        show_librdkafka_logs()
    handler: CommandHandler | None = getattr(args, "handler", None)
    if handler is None:
        # A command group without a sub-command: show what it offers.
        help_parser: argparse.ArgumentParser = getattr(args, "help_parser", parser)
        help_parser.print_help(sys.stderr)
        return 2
    try:
        process_tracing()  # from the OTEL_* variables; nothing when they ask for none
        return handler(args)
    except BrokerUnreachableError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except CommandRefusedError as error:
        if error.outcome is None:  # decided from a read (``status`` of an unknown id)
            print(f"error: {error}", file=sys.stderr)
            return EXIT_ERROR
        print(f"refused: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except CommandTimeoutError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_NO_ANSWER
    except TurnstileError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (``turnstile history show X | head``): not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
