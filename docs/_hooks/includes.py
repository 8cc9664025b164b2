"""MkDocs hook: pages that show files and data kept outside ``docs/``.

- ``<!-- include: schemas/README.md -->`` on a line of its own is replaced by that file, so
  the wire contract (or the benchmark summary) has one text, read on GitHub beside its
  subject and on the site alike. Its relative links are relative to its own folder: one
  that reaches a page of ``docs/`` is pointed at that page, any other (``recipes/java``,
  which the site does not serve) becomes plain text naming the path from the repository
  root. When the page has its own title before the marker, the file's headings move one
  level down. (``ARCHITECTURE.md`` has no such links and comes in through
  ``pymdownx.snippets``.)
- ``<!-- results-table: NAME -->`` is replaced by every recorded row of that benchmark
  (``benchmarks/results/NAME.jsonl``), as ``benchmarks/results_md.py --table NAME`` prints
  them, so a benchmark's notes show their data where the notes discuss it.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
INCLUDE = re.compile(r"^<!--\s*include:\s*(\S+)\s*-->$", re.MULTILINE)
RESULTS_TABLE = re.compile(r"^<!--\s*results-table:\s*(\S+)\s*-->$", re.MULTILINE)
LINK = re.compile(r"\[([^\]]+)\]\((?!https?://|#)([^)\s#]+)(#[^)\s]*)?\)")
HEADING = re.compile(r"^(#{1,5}) ", re.MULTILINE)


def _relink(text: str, source: Path, page: Path) -> str:
    """The relative links of ``source``'s text, made right for a page at ``page``."""

    def relink(match: re.Match[str]) -> str:
        label, target, anchor = match.group(1), match.group(2), match.group(3) or ""
        resolved = (source.parent / target).resolve()
        if resolved.is_relative_to(DOCS) and resolved.suffix == ".md":
            return f"[{label}]({os.path.relpath(resolved, page.parent)}{anchor})"
        where = resolved.relative_to(ROOT).as_posix()
        return label if where in label else f"{label} (`{where}`)"

    return LINK.sub(relink, text)


def _demoted(text: str) -> str:
    """Every heading one level down, outside fenced code."""
    parts = re.split(r"(^```.*?^```)", text, flags=re.MULTILINE | re.DOTALL)
    return "".join(p if p.startswith("```") else HEADING.sub(r"#\1 ", p) for p in parts)


def included(path: str, page: Path, demote: bool = False) -> str:
    """The file's text, its relative links made right for ``page``."""
    source = ROOT / path
    text = _relink(source.read_text(encoding="utf-8"), source, page)
    return _demoted(text) if demote else text


def results_table(name: str) -> str:
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    results_md = importlib.import_module("results_md")
    return str(results_md.table_markdown(name))


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Expand the page's include and results-table markers."""
    where = DOCS / page.file.src_uri

    def include(match: re.Match[str]) -> str:
        titled = re.search(r"^# ", markdown[: match.start()], re.MULTILINE) is not None
        return included(match.group(1), where, demote=titled)

    markdown = INCLUDE.sub(include, markdown)
    return RESULTS_TABLE.sub(lambda m: results_table(m.group(1)), markdown)
