"""Griffe extension: the engine's docstrings use Sphinx roles (``:class:`Client```,
``:meth:`Client.start```) and reST literal blocks (``::``); on the site they read as code.

The roles become inline code (a ``~`` prefix keeps the last name only), and a paragraph
ending in ``::`` ends in ``:`` (the indented block after it is a code block in Markdown
as in reST).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|attr|data|exc|mod|obj|const):`~?([^`]+)`")
LITERAL = re.compile(r"::$", re.MULTILINE)


def _code(match: re.Match[str]) -> str:
    name = match.group(1)
    shown = name.rsplit(".", 1)[-1] if match.group(0).split("`", 1)[1].startswith("~") else name
    return f"`{shown}`"


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring once the object tree is loaded."""

    def on_instance(self, *, obj: griffe.Object, **_: Any) -> None:
        if obj.docstring is not None:
            text = ROLE.sub(_code, obj.docstring.value)
            obj.docstring.value = LITERAL.sub(":", text)
