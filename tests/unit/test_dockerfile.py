"""The Dockerfile cannot be built in every test environment (no Docker engine there), so
its content is held to the rules here: a pinned slim base, the engine installed from the
wheel built from this checkout (no source tree, no dev tools, no install at start), a
non-root user, and a build context that leaves local state out."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text(encoding="utf-8")
INSTRUCTIONS = [
    line.strip()
    for line in re.sub(r"\\\n", " ", DOCKERFILE).splitlines()
    if line.strip() and not line.lstrip().startswith("#")
]


def _all(keyword: str) -> list[str]:
    return [i[len(keyword) :].strip() for i in INSTRUCTIONS if i.upper().startswith(keyword + " ")]


def test_bases_are_pinned_slim_python_images() -> None:
    bases = _all("FROM")
    assert len(bases) == 2, "a build stage for the wheel and a runtime stage"
    for base in bases:
        image = base.split()[0]
        assert re.fullmatch(r"python:3\.1[1-9]-slim", image), image


def test_the_wheel_is_built_and_installed_not_the_source_tree() -> None:
    runs = _all("RUN")
    assert any("pip wheel" in r and "--no-deps" in r for r in runs)
    installs = [r for r in runs if "pip install" in r]
    assert installs and all(".whl" in r for r in installs), installs
    assert not any("[dev]" in r or "-e " in r for r in runs)
    runtime = DOCKERFILE[DOCKERFILE.rindex("\nFROM ") :]
    runtime_copies = [line for line in runtime.splitlines() if line.startswith("COPY ")]
    assert runtime_copies and all("--from=build" in c for c in runtime_copies), runtime_copies


def test_every_file_the_build_copies_exists_and_passes_the_dockerignore() -> None:
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for copy in _all("COPY"):
        if copy.startswith("--from"):
            continue
        *sources, _target = copy.split()
        for source in sources:
            name = source.rstrip("/")
            assert (ROOT / name).exists(), f"the Dockerfile copies {name}, which does not exist"
            assert name in allowed, f"{name} is excluded from the build context"
    for local_state in (".venv", ".broker", ".git", "tests"):
        assert local_state not in allowed


def test_runs_as_a_non_root_user_with_the_turnstile_entrypoint() -> None:
    users = _all("USER")
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert INSTRUCTIONS.index(f"USER {users[-1]}") > max(
        i for i, line in enumerate(INSTRUCTIONS) if line.startswith("RUN ")
    ), "the last RUN happens before switching to the unprivileged user"
    assert _all("ENTRYPOINT") == ['["turnstile"]']
    assert any("TURNSTILE_STATE_DIR=/state" in env for env in _all("ENV"))
