"""The documentation runs as written: README.md and every page of ``docs/``.

Every code block carries a marker on the line before it, an HTML comment that renders as
nothing:

- ``<!-- file: NAME -->``: the block is saved as NAME in the folder the page's blocks run in;
- ``<!-- run: kafka -->``: a bash block runs there with ``bash -e``, a python block with
  the interpreter, against the test broker (the docs' ``127.0.0.1:9092`` is replaced by
  its address, the metrics port ``9464`` and the dashboard's ``8080`` by free ones) in a
  namespace of its own; variables a bash block exports stay set for the blocks after it,
  as in the reader's shell;
- ``<!-- run: background -->``: a bash block that keeps running (``turnstile run all``)
  while the blocks after it run, and must stop cleanly on SIGTERM once every page ran
  (exit 0, or end by that SIGTERM, as uvicorn does after its graceful shutdown);
- ``<!-- check: settings -->``: a TOML block that must load as a settings file;
- ``<!-- not run: REASON -->``: a block no test here can run, and why (another test may).

The blocks of one page run in order, as one reader's session: one folder, one shell
environment, one namespace. A page that builds on another says so at its top with
``<!-- needs: PAGE -->`` (a path under ``docs/``; under its title, so that the site still
takes the title from the first line): that page runs first, once per test
run, and this one goes on in its folder, with its environment and the processes it
started (the tutorial's engine, say). A page needs at most one other; that one may need
another in turn.

A block without a marker fails the test, so a new example cannot slip in unexecuted. The
settings table of ``docs/reference/settings.md`` is compared with
:class:`engine.config.settings.Settings` field by field.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest
import yaml

from engine.config.settings import Settings, env_name, load_settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SETTINGS_PAGE = DOCS / "reference" / "settings.md"
BIN = Path(sys.executable).parent
DOCS_BROKER = "127.0.0.1:9092"
#: The docs' metrics and dashboard ports, replaced by free ones (the machine may run other
#: engines).
DOCS_PORTS = {
    "9464": re.compile(r"(?<=--metrics-port )9464\b|(?<=127\.0\.0\.1:)9464\b"),
    "8080": re.compile(r"(?<=--port )8080\b|(?<=127\.0\.0\.1:)8080\b"),
}
MARKER = re.compile(r"<!--\s*(file|run|check|not run):\s*(.*?)\s*-->")
NEEDS = re.compile(r"<!--\s*needs:\s*(\S+?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
#: Languages whose blocks are code (output samples are ``text``).
CODE = {"python", "bash", "sh", "toml"}
COMMAND_TIMEOUT = 300


@dataclass(frozen=True)
class Block:
    page: str
    language: str
    body: str
    kind: str  # "file", "run", "check", "not run", or "" when unmarked
    argument: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.page}, line {self.line}"


@dataclass(frozen=True)
class Page:
    name: str  # the path from the repository root: README.md, docs/tutorial/run-it.md
    blocks: tuple[Block, ...]
    needs: str | None  # the page it builds on, from the repository root

    @property
    def runs(self) -> bool:
        return any(b.kind in {"file", "run"} for b in self.blocks)


def page_blocks(name: str, text: str) -> list[Block]:
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
        blocks.append(Block(name, opening.group(1), body, kind, argument, index + 1))
        index = end + 1
    return blocks


def _nav_order() -> list[str]:
    """The pages of mkdocs.yml's nav, in reading order (paths under ``docs/``)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    order: list[str] = []

    def walk(entry: object) -> None:
        if isinstance(entry, str):
            order.append(entry)
        elif isinstance(entry, list):
            for item in entry:
                walk(item)
        elif isinstance(entry, dict):
            for value in entry.values():
                walk(value)

    walk(config["nav"])
    return [p for p in order if p.endswith(".md")]


def load_pages() -> list[Page]:
    """README.md, then the docs pages in the nav's order (pages outside the nav last)."""
    nav = _nav_order()
    found = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    ordered = [p for p in nav if p in found] + [p for p in found if p not in nav]
    pages = []
    for name in ["README.md", *(f"docs/{p}" for p in ordered)]:
        text = (ROOT / name).read_text(encoding="utf-8")
        needs = NEEDS.findall(text)
        assert len(needs) <= 1, f"{name}: a page needs at most one other page"
        pages.append(
            Page(name, tuple(page_blocks(name, text)), f"docs/{needs[0]}" if needs else None)
        )
    return pages


PAGES = load_pages()
BY_NAME = {p.name: p for p in PAGES}
BLOCKS = [b for p in PAGES for b in p.blocks]


def test_every_docs_page_is_in_the_nav() -> None:
    nav = set(_nav_order())
    missing = [p.name for p in PAGES[1:] if p.name.removeprefix("docs/") not in nav]
    assert not missing, f"pages the site's navigation does not reach: {missing}"


def test_every_code_block_says_how_it_is_tested() -> None:
    unmarked = [b.where for b in BLOCKS if b.language in CODE and not b.kind]
    assert not unmarked, f"code blocks without a test marker: {'; '.join(unmarked)}"
    for block in BLOCKS:
        if block.kind == "not run":
            assert len(block.argument) > 10, f"{block.where}: say why it is not run"
        if block.kind == "run":
            assert block.argument in {"kafka", "background"}, block.where
            assert block.language in {"bash", "python"}, block.where


def test_a_page_builds_only_on_a_page_that_runs() -> None:
    for page in PAGES:
        seen = [page.name]
        needs = page.needs
        while needs is not None:
            assert needs in BY_NAME, f"{page.name} needs {needs}, which is not a docs page"
            assert needs not in seen, f"{page.name}: the pages it needs form a circle: {seen}"
            assert BY_NAME[needs].runs, f"{page.name} needs {needs}, which runs nothing"
            seen.append(needs)
            needs = BY_NAME[needs].needs


def test_the_blocks_that_run_are_most_of_the_docs() -> None:
    code = [b for b in BLOCKS if b.language in CODE]
    tested = [b for b in code if b.kind != "not run"]
    assert len(tested) >= 2 * (len(code) - len(tested)), "most examples must be executed"


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.kind == "check"], ids=lambda b: f"{b.page}:{b.line}"
)
def test_settings_examples_load(block: Block, tmp_path: Path) -> None:
    path = tmp_path / "turnstile.toml"
    path.write_text(block.body, encoding="utf-8")
    settings = load_settings(path, env={})
    assert settings != load_settings(env={}), "the example changes no setting"
    for key, value in settings.extra_kafka.items():
        assert key in block.body and value in block.body


def _settings_table() -> dict[str, tuple[str, str]]:
    rows: dict[str, tuple[str, str]] = {}
    for line in SETTINGS_PAGE.read_text(encoding="utf-8").splitlines():
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


# --- running the pages ----------------------------------------------------------------------


EXPORT = re.compile(r"^export (\w+)=", re.MULTILINE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Reader:
    """Where a page's blocks run: the folder, the shell's variables and the free ports."""

    folder: Path
    env: dict[str, str]
    ports: dict[str, int]

    def localize(self, body: str, bootstrap: str) -> str:
        """The block as it runs here: the test broker and free ports."""
        body = body.replace(DOCS_BROKER, bootstrap)
        for port, pattern in DOCS_PORTS.items():
            body = pattern.sub(str(self.ports[port]), body)
        return body

    def follow(self) -> Reader:
        """A reader who goes on from here (a page that needs this one)."""
        return Reader(self.folder, dict(self.env), self.ports)


@dataclass
class Background:
    block: Block
    process: subprocess.Popen[str]
    log: Path


@dataclass
class DocsSession:
    """The pages run so far in this test run, each once, and the processes they left."""

    bootstrap: str
    tmp: Path
    readers: dict[str, Reader] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    background: list[Background] = field(default_factory=list)

    def run(self, page: Page) -> Reader:
        if page.name in self.readers:
            return self.readers[page.name]
        if page.name in self.failed:
            pytest.fail(f"{page.name} failed earlier in this run: {self.failed[page.name]}")
        reader = self.run(BY_NAME[page.needs]).follow() if page.needs else self._new_reader(page)
        try:
            for block in page.blocks:
                self._run_block(block, reader)
        except BaseException as error:
            self.failed[page.name] = str(error).splitlines()[0] if str(error) else repr(error)
            raise
        self.readers[page.name] = reader
        return reader

    def _new_reader(self, page: Page) -> Reader:
        slug = re.sub(r"\W+", "-", page.name.removesuffix(".md")).strip("-")
        folder = self.tmp / slug / "project"
        folder.mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
        env.update(
            {
                "ENGINE_BOOTSTRAP_SERVERS": self.bootstrap,
                "TURNSTILE_NAMESPACE": f"docs-{uuid.uuid4().hex[:8]}",
                "TURNSTILE_STATE_DIR": str(folder.parent / "state"),
                "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            }
        )
        return Reader(folder, env, {port: _free_port() for port in DOCS_PORTS})

    def _run_block(self, block: Block, reader: Reader) -> None:
        if block.kind == "file":
            (reader.folder / block.argument).write_text(block.body, encoding="utf-8")
        elif block.kind == "run" and block.argument == "background":
            self._start_background(block, reader)
        elif block.kind == "run":
            _run_command_block(block, reader, self.bootstrap)

    def _start_background(self, block: Block, reader: Reader) -> None:
        log = reader.folder.parent / f"background-{block.line}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                ["bash", "-c", f"exec {reader.localize(block.body, self.bootstrap).strip()}"],
                cwd=reader.folder,
                env=reader.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        self.background.append(Background(block, process, log))

    def stop(self) -> list[str]:
        """Stop the background processes; what did not stop cleanly, and its output."""
        for running in self.background:
            running.process.send_signal(signal.SIGTERM)
        problems = []
        for running in self.background:
            try:
                code = running.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                running.process.kill()
                code = running.process.wait()
            if code not in (0, -signal.SIGTERM):
                output = running.log.read_text(encoding="utf-8")
                problems.append(f"{running.block.where} exited {code}:\n{output}")
        return problems


def _run_command_block(block: Block, reader: Reader, bootstrap: str) -> None:
    """Run one block; what it exports is added to the reader's environment."""
    body = reader.localize(block.body, bootstrap)
    exported = EXPORT.findall(body)
    dump_file = reader.folder.parent / f"exports-{uuid.uuid4().hex[:8]}"
    if block.language == "python":
        command = [sys.executable, "-c", body]
    else:
        dump = "".join(f'printf "%s=%s\\0" {n} "${n}" >> "{dump_file}"\n' for n in exported)
        command = ["bash", "-euo", "pipefail", "-c", body + dump]
    result = subprocess.run(
        command,
        cwd=reader.folder,
        env=reader.env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )
    if dump_file.exists():
        for item in dump_file.read_bytes().split(b"\0"):
            if item:
                name, _, value = item.decode().partition("=")
                reader.env[name] = value
    assert result.returncode == 0, (
        f"{block.where}: the block exited {result.returncode}:\n{block.body}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )


@pytest.fixture(scope="module")
def docs_session(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DocsSession]:
    session = DocsSession(kafka_bootstrap, tmp_path_factory.mktemp("docs"))
    try:
        yield session
    finally:
        problems = session.stop()
        assert not problems, "background blocks that did not stop cleanly:\n" + "\n".join(problems)


@pytest.mark.kafka
@pytest.mark.parametrize("page", [p for p in PAGES if p.runs], ids=lambda p: p.name)
def test_the_page_runs_as_written(page: Page, docs_session: DocsSession) -> None:
    docs_session.run(page)
