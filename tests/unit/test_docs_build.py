"""The documentation site builds without a warning: ``mkdocs build --strict``.

Strict mode fails on a broken link between pages, a link to a heading that does not exist,
a page missing from the navigation, and a docstring mkdocstrings cannot render, so the
site, its cross-links and the API reference stay whole. The built command-line reference
names every ``turnstile`` command, as the parsers define them.
"""

from __future__ import annotations

import html
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mkdocs = BIN / "mkdocs"
    if not mkdocs.exists():
        pytest.fail(f"mkdocs is not installed in {BIN}; run 'bash .ci/setup' (the docs extra).")
    folder = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    return folder


def _cli_reference_hook() -> object:
    spec = importlib.util.spec_from_file_location(
        "cli_reference", ROOT / "docs" / "_hooks" / "cli_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    pages = sorted(p.relative_to(ROOT / "docs") for p in (ROOT / "docs").rglob("*.md"))
    for page in pages:
        built = site / page.with_suffix("") / "index.html"
        if page.name == "index.md":
            built = site / page.parent / "index.html"
        assert built.exists(), f"{page} was not built"


def test_the_cli_reference_shows_every_command(site: Path) -> None:
    hook = _cli_reference_hook()
    paths = [" ".join(path) for path, _parser in hook.commands()]  # type: ignore[attr-defined]
    assert {"turnstile run processor", "turnstile dev kafka start"} <= set(paths)
    page = html.unescape((site / "reference" / "cli" / "index.html").read_text("utf-8"))
    missing = [p for p in paths if f"<code>{p}</code>" not in page]
    assert not missing, f"commands missing from the built CLI reference: {missing}"


def _is_error(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseException)


def test_the_api_reference_shows_every_public_name(site: Path) -> None:
    import engine
    import engine.client
    import engine.core.errors as errors
    import engine.testing

    # the errors that ``engine`` exports are shown with the whole tree, on the errors page
    exported = [n for n in engine.__all__ if n != "__version__"]
    own_errors = [
        n for n, v in vars(errors).items() if _is_error(v) and v.__module__ == errors.__name__
    ]
    pages = {
        "api/engine": ("engine", [n for n in exported if not _is_error(getattr(engine, n))]),
        "api/client": ("engine.client", engine.client.__all__),
        "api/testing": ("engine.testing", engine.testing.__all__),
        "errors": ("engine.core.errors", own_errors),
    }
    for page, (module, names) in pages.items():
        text = (site / "reference" / page / "index.html").read_text("utf-8")
        missing = [n for n in names if f'id="{module}.{n}"' not in text]
        assert not missing, f"reference/{page}.md does not show {missing}"
