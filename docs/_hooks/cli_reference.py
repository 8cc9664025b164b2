"""MkDocs hook: the CLI reference, generated from the ``turnstile`` argparse parsers.

``docs/reference/cli.md`` holds the marker ``<!-- cli-reference -->``; at build time it is
replaced by one section per command, with the command's own ``--help``, so the reference
cannot drift from the parsers (``tests/unit/test_docs_build.py`` checks that the built page
names every command).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

MARKER = "<!-- cli-reference -->"
#: The width the help text is wrapped at, whatever the terminal that builds the site.
HELP_COLUMNS = "100"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """The direct sub-commands of ``parser`` in the order they were added (aliases once)."""
    seen: set[int] = set()
    found = []
    # argparse has no public way to list a parser's sub-commands.
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    found.append((name, sub))
    return found


def commands(
    parser: argparse.ArgumentParser | None = None, path: tuple[str, ...] = ("turnstile",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command and command group, depth first: (``("turnstile", "dev", "kafka")``,
    its parser)."""
    if parser is None:
        from engine.cli.main import build_parser

        parser = build_parser()
    yield path, parser
    for name, sub in _subcommands(parser):
        yield from commands(sub, (*path, name))


def cli_reference() -> str:
    """The generated Markdown: one heading and one help text per command."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        sections = []
        for path, parser in commands():
            level = "#" * min(len(path) + 1, 6)
            help_text = parser.format_help().rstrip()
            sections.append(f"{level} `{' '.join(path)}`\n\n```text\n{help_text}\n```\n")
        return "\n".join(sections)
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Expand the marker where a page has it."""
    return markdown.replace(MARKER, cli_reference()) if MARKER in markdown else markdown
