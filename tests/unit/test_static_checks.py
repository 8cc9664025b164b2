"""Lint, type and layering checks run as tests, so that the one test command covers them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*command: str) -> None:
    """Run a checker from the repository root; fail with its output if it complains."""
    executable = BIN / command[0]
    if not executable.exists():
        pytest.fail(f"{command[0]} is not installed in {BIN}; run 'bash .ci/setup'.")
    result = subprocess.run(
        [str(executable), *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}"


def test_ruff() -> None:
    _run(
        "ruff",
        "check",
        *[p for p in ("engine", "tests", "benchmarks", "docs") if (ROOT / p).is_dir()],
    )


def test_mypy_strict() -> None:
    _run("mypy")  # settings (strict, packages) live in pyproject.toml


def test_import_layers() -> None:
    _run("lint-imports")
