"""``.ci/setup`` on a fresh Debian or Ubuntu machine: what it decides to install.

Run with ``--dry-run`` in a copy of the checkout with no ``.venv``, on a PATH of its own
where ``java``, ``mvn``, ``kcat`` and ``python3``'s ensurepip are present or not as each
case needs, it names every package it would install with apt-get, one line each, and
nothing that is already there. (A real install needs root and a package mirror; CI's own
run of ``.ci/setup`` is the end-to-end check on a machine that has everything.)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("bash", "dirname", "id", "sed", "head", "grep", "sha256sum", "cut", "cat", "env")
#: What apt's package lists offer in these cases (``apt-cache show`` of anything else fails).
OFFERED = ("openjdk-17-jre-headless", "maven", "kcat", "chromium", "python3-venv")


def _script(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(0o755)


def _machine(tmp_path: Path, *, java: str | None, mvn: bool, kcat: bool, venv: bool) -> Path:
    """A PATH with the basic tools, apt-cache and the given programs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    offered = " ".join(OFFERED)
    _script(
        bin_dir, "apt-cache", f'for p in {offered}; do [ "$2" = "$p" ] && exit 0; done; exit 100'
    )
    ensurepip = "exit 0" if venv else 'case "$*" in *ensurepip*) exit 1;; esac; exit 0'
    _script(bin_dir, "python3", ensurepip)
    if java is not None:
        _script(bin_dir, "java", f"echo 'openjdk version \"{java}\" 2025-04-15' >&2")
    if mvn:
        _script(bin_dir, "mvn", "exit 0")
    if kcat:
        _script(bin_dir, "kcat", "exit 0")
    return bin_dir


def _dry_run(tmp_path: Path, bin_dir: Path) -> list[str]:
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "setup", checkout / ".ci" / "setup")
    shutil.copy(ROOT / "pyproject.toml", checkout / "pyproject.toml")
    result = subprocess.run(
        ["bash", str(checkout / ".ci" / "setup"), "--dry-run"],
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert not (checkout / ".venv").exists(), "a dry run must change nothing"
    return result.stderr.splitlines()


def _installs(lines: list[str]) -> set[str]:
    """The packages the dry run would install with apt-get."""
    return {line.split()[3] for line in lines if " (apt-get) " in line}


def test_a_machine_with_only_python_gets_the_venv_module_java_maven_and_kcat(
    tmp_path: Path,
) -> None:
    lines = _dry_run(tmp_path, _machine(tmp_path, java=None, mvn=False, kcat=False, venv=False))
    expected = {"python3-venv", "openjdk-17-jre-headless", "maven", "kcat"}
    assert expected <= _installs(lines) <= expected | {"chromium"}
    assert "setup: would create .venv" in lines
    assert any("no java on PATH" in line for line in lines)


def test_a_java_older_than_17_gets_a_newer_one(tmp_path: Path) -> None:
    lines = _dry_run(tmp_path, _machine(tmp_path, java="11.0.2", mvn=True, kcat=True, venv=True))
    assert _installs(lines) - {"chromium"} == {"openjdk-17-jre-headless"}
    assert any("java 11" in line for line in lines)


@pytest.mark.parametrize("version", ["17.0.15", "21.0.4"])
def test_what_is_there_is_not_installed_again(tmp_path: Path, version: str) -> None:
    lines = _dry_run(tmp_path, _machine(tmp_path, java=version, mvn=True, kcat=True, venv=True))
    assert _installs(lines) <= {"chromium"}  # /usr/bin/chromium is looked for by its path
