"""``turnstile versions``: how many instances run each workflow version.

Instances stay on the version they started with, so old code must stay deployed while any
instance of its version is open; this command (and the processor's
``turnstile_instances_by_version`` gauge) says when that is over. It reads the status
topic, like ``list``.
"""

from __future__ import annotations

import argparse
import json

from engine.cli import SubParsers
from engine.cli.options import add_settings_arguments, connected_settings
from engine.client import Client

__all__ = ["register"]


def register(subparsers: SubParsers) -> None:
    """Add ``versions``."""
    help_text = "count the instances of each workflow version (open and ended)"
    parser = subparsers.add_parser(
        "versions",
        help=help_text,
        description=f"{help_text.capitalize()}. Open means PENDING, RUNNING, SUSPENDED or "
        "PARKED: a version with no open instances no longer runs anywhere, so its code can be "
        "removed once its finished histories need no replay either.",
    )
    add_settings_arguments(parser)
    parser.add_argument("--name", help="only this workflow")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.set_defaults(handler=_versions)


def _versions(args: argparse.Namespace) -> int:
    with Client.from_settings(connected_settings(args)) as client:
        counts = client.versions(args.name)
    if args.json:
        print(json.dumps([c.to_json() for c in counts], indent=2, sort_keys=True))
        return 0
    if not counts:
        print("no instances" + (f" of workflow {args.name!r}" if args.name else ""))
        return 0
    rows = [("WORKFLOW", "VERSION", "OPEN", "ENDED")]
    rows += [(c.name, c.version or '""', str(c.open), str(c.ended)) for c in counts]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return 0
