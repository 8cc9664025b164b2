"""README.md runs as written.

Every code block in the README carries a marker on the line before it, an HTML comment that
renders as nothing:

- ``<!-- file: NAME -->``: the block is saved as NAME in the folder the other blocks run in;
- ``<!-- run: kafka -->``: a bash block runs there with ``bash -e``, a python block with
  the interpreter, against the test broker (the README's ``127.0.0.1:9092`` is replaced by
  its address, its metrics port ``9464`` by a free one) in a namespace of its own;
  variables a bash block exports stay set for the blocks after it, as in the reader's shell;
- ``<!-- run: background -->``: a bash block that keeps running (``turnstile run all``)
  while the blocks after it run, and must stop cleanly on SIGTERM;
- ``<!-- check: settings -->``: a TOML block that must load as a settings file;
- ``<!-- not run: REASON -->``: a block no test here can run, and why (another test may).

A block without a marker fails the test, so a new example cannot slip in unexecuted. The
settings table is compared with :class:`engine.config.settings.Settings` field by field.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from engine.config.settings import Settings, env_name, load_settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
README_BROKER = "127.0.0.1:9092"
#: The README's metrics port, replaced by a free one (the machine may run other engines).
README_METRICS_PORT = re.compile(r"(?<=--metrics-port )9464\b|(?<=127\.0\.0\.1:)9464\b")
MARKER = re.compile(r"<!--\s*(file|run|check|not run):\s*(.*?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
#: Languages whose blocks are code (output samples are ``text``).
CODE = {"python", "bash", "sh", "toml"}
COMMAND_TIMEOUT = 300


@dataclass(frozen=True)
class Block:
    language: str
    body: str
    kind: str  # "file", "run", "check", "not run", or "" when unmarked
    argument: str
    line: int


def readme_blocks(text: str) -> list[Block]:
    """The fenced blocks of ``text`` in order, with the marker on the line before each."""
    lines = text.splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening or not opening.group(1):
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        marker = MARKER.fullmatch(lines[index - 1].strip()) if index else None
        kind, argument = (marker.group(1), marker.group(2)) if marker else ("", "")
        body = "\n".join(lines[index + 1 : end]) + "\n"
        blocks.append(Block(opening.group(1), body, kind, argument, index + 1))
        index = end + 1
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def test_every_code_block_says_how_it_is_tested() -> None:
    unmarked = [f"line {b.line}" for b in BLOCKS if b.language in CODE and not b.kind]
    assert not unmarked, f"README code blocks without a test marker: {', '.join(unmarked)}"
    for block in BLOCKS:
        if block.kind == "not run":
            assert len(block.argument) > 10, f"line {block.line}: say why it is not run"
        if block.kind == "run":
            assert block.argument in {"kafka", "background"}, f"line {block.line}"
            assert block.language in {"bash", "python"}, f"line {block.line}"


def test_the_blocks_that_run_are_most_of_the_readme() -> None:
    code = [b for b in BLOCKS if b.language in CODE]
    tested = [b for b in code if b.kind != "not run"]
    assert len(tested) >= 2 * (len(code) - len(tested)), "most examples must be executed"


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.kind == "check"], ids=lambda b: f"line{b.line}"
)
def test_settings_examples_load(block: Block, tmp_path: Path) -> None:
    path = tmp_path / "turnstile.toml"
    path.write_text(block.body, encoding="utf-8")
    settings = load_settings(path, env={})
    assert settings.extra_kafka or settings.bootstrap_servers != Settings().bootstrap_servers
    for key, value in settings.extra_kafka.items():
        assert key in block.body and value in block.body


def _settings_table() -> dict[str, tuple[str, str]]:
    rows: dict[str, tuple[str, str]] = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`") and cells[1].startswith("`TURNSTILE_"):
            rows[cells[0].strip("`")] = (cells[1].strip("`"), cells[2])
    return rows


def test_the_settings_table_lists_every_setting_with_its_env_name_and_default() -> None:
    table = _settings_table()
    assert sorted(table) == sorted(f.name for f in fields(Settings))
    defaults = Settings()
    for name, (env, default) in table.items():
        assert env == env_name(name)
        value = getattr(defaults, name)
        if name == "state_dir":
            assert default == "`~/.cache/turnstile/state`"
            assert value == str(Path.home() / ".cache/turnstile/state")
        elif value in ((), {}, ""):
            assert default == "(none)", name
        else:
            assert default == f"`{value}`", name


# --- running the README ---------------------------------------------------------------------


def _environment(bootstrap: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env.update(
        {
            "ENGINE_BOOTSTRAP_SERVERS": bootstrap,
            "TURNSTILE_NAMESPACE": f"readme-{uuid.uuid4().hex[:8]}",
            "TURNSTILE_STATE_DIR": str(tmp_path / "state"),
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    return env


EXPORT = re.compile(r"^export (\w+)=", re.MULTILINE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _localize(body: str, bootstrap: str, metrics_port: int) -> str:
    """The block as it runs here: the test broker and a free metrics port."""
    return README_METRICS_PORT.sub(str(metrics_port), body.replace(README_BROKER, bootstrap))


def _run_block(block: Block, cwd: Path, env: dict[str, str], bootstrap: str, port: int) -> None:
    """Run one block; what it exports is added to ``env``."""
    body = _localize(block.body, bootstrap, port)
    exported = EXPORT.findall(body)
    dump_file = cwd.parent / f"exports-{block.line}"
    if block.language == "python":
        command = [sys.executable, "-c", body]
    else:
        dump = "".join(f'printf "%s=%s\\0" {n} "${n}" >> "{dump_file}"\n' for n in exported)
        command = ["bash", "-euo", "pipefail", "-c", body + dump]
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT
    )
    if dump_file.exists():
        for item in dump_file.read_bytes().split(b"\0"):
            if item:
                name, _, value = item.decode().partition("=")
                env[name] = value
    assert result.returncode == 0, (
        f"README block at line {block.line} exited {result.returncode}:\n{block.body}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )


@pytest.mark.kafka
def test_the_readme_runs_as_written(kafka_bootstrap: str, tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    env = _environment(kafka_bootstrap, tmp_path)
    port = _free_port()
    background: list[tuple[Block, subprocess.Popen[str], Path]] = []
    try:
        for block in BLOCKS:
            if block.kind == "file":
                (folder / block.argument).write_text(block.body, encoding="utf-8")
            elif block.kind == "run" and block.argument == "background":
                log = tmp_path / f"background-{block.line}.log"
                with log.open("w") as out:
                    process = subprocess.Popen(
                        [
                            "bash",
                            "-c",
                            f"exec {_localize(block.body, kafka_bootstrap, port).strip()}",
                        ],
                        cwd=folder,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                background.append((block, process, log))
            elif block.kind == "run":
                _run_block(block, folder, env, kafka_bootstrap, port)
    finally:
        for _block, process, _log in background:
            process.send_signal(signal.SIGTERM)
        for block, process, log in background:
            try:
                code = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            output = log.read_text(encoding="utf-8")
            assert code == 0, f"README block at line {block.line} exited {code}:\n{output}"
