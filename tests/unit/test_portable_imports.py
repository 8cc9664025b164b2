"""The CLI must start on any platform: no engine module imports a POSIX-only module at its
top level (they are imported where they are used, e.g. the dev broker's file lock)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POSIX_ONLY = {"fcntl", "termios", "pwd", "grp", "resource", "posix"}


@pytest.mark.parametrize(
    "path", sorted((ROOT / "engine").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_top_level_posix_only_imports(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module.split(".")[0]]
        found = POSIX_ONLY.intersection(names)
        assert not found, f"{path.name}:{node.lineno} imports {found} at import time"
