"""MkDocs hook: pages that show a file of the repository kept outside ``docs/``.

``<!-- include: schemas/README.md -->`` on a line of its own is replaced by that file, so
the wire contract has one text, read on GitHub beside the schemas and on the site alike.
Its links are relative to its own folder (``recipes/java``), which the site does not
serve, so they become plain text naming the path from the repository root.
(``ARCHITECTURE.md`` has no such links and comes in through ``pymdownx.snippets``.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r"^<!--\s*include:\s*(\S+)\s*-->$", re.MULTILINE)
LINK = re.compile(r"\[([^\]]+)\]\((?!https?://|#)([^)\s]+)\)")


def included(path: str) -> str:
    """The file's text, its relative links turned into the repository paths they name."""
    source = ROOT / path
    text = source.read_text(encoding="utf-8")
    folder = source.parent.relative_to(ROOT)

    def unlink(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        where = (folder / target).as_posix()
        return label if where in label else f"{label} (`{where}`)"

    return LINK.sub(unlink, text)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Expand every include marker of the page."""
    return INCLUDE.sub(lambda m: included(m.group(1)), markdown)
