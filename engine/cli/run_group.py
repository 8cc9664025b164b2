"""The shared ``run`` command group: ``run worker``, ``run processor``, ``run all``...

Several command modules add processes to ``run``; argparse allows a command name only once,
so the group is created by the first module that asks for it and handed to the others.
"""

from __future__ import annotations

import weakref

from engine.cli import SubParsers

__all__ = ["run_subparsers"]

_GROUPS: weakref.WeakKeyDictionary[SubParsers, SubParsers] = weakref.WeakKeyDictionary()


def run_subparsers(subparsers: SubParsers) -> SubParsers:
    """The sub-commands of ``run`` under ``subparsers`` (created on first use)."""
    group = _GROUPS.get(subparsers)
    if group is None:
        run = subparsers.add_parser(
            "run",
            help="run an engine process (worker, processor...) until stopped",
            description="Run a long-lived engine process in the foreground; SIGTERM or "
            "Ctrl-C stops it gracefully.",
        )
        run.set_defaults(help_parser=run)
        group = run.add_subparsers(title="processes", metavar="PROCESS")
        _GROUPS[subparsers] = group
    return group
