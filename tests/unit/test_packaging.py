"""What the wheel is made of, checked without building it (the wheel test builds one).

The package list in pyproject.toml is explicit (it maps schemas/ and topics/ into the
package), so a new sub-package that is not added there would be missing from the wheel.
"""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

import engine
from engine.codec.contracts import SCHEMAS, TOPICS, contract_dir

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_engine_package_is_in_the_wheel() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {
        ".".join(folder.relative_to(ROOT).parts)
        for folder in (ROOT / "engine").rglob("*")
        if folder.is_dir() and folder.name != "__pycache__" and any(folder.glob("*.py"))
    } | {"engine"}
    missing = sorted(found - listed)
    assert not missing, f"add {missing} to [tool.setuptools] packages in pyproject.toml"


def test_the_contract_folders_are_mapped_into_the_package() -> None:
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert mapping == {"engine._contracts.schemas": SCHEMAS, "engine._contracts.topics": TOPICS}
    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    assert "released/*/*.avsc" in data["engine._contracts.schemas"]
    assert "py.typed" in data["engine"] and (ROOT / "engine" / "py.typed").is_file()


def test_a_checkout_finds_its_own_contract_folders() -> None:
    assert contract_dir(SCHEMAS) == ROOT / "schemas"
    assert contract_dir(TOPICS) == ROOT / "topics"


def test_metadata_is_complete() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert project["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "engine.__version__"}
    assert "Typing :: Typed" in project["classifiers"]
    assert project["readme"] == "README.md"
    assert project["scripts"]["turnstile"] == "engine.cli.main:main"


def test_the_changelog_knows_the_version() -> None:
    assert f"## [{engine.__version__}]" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_the_dashboards_static_files_are_package_data() -> None:
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["engine.ui"]
    ui = ROOT / "engine" / "ui"
    assets = [p.relative_to(ui).as_posix() for p in (ui / "static").iterdir() if p.is_file()]
    assert assets, "the dashboard ships its page"
    unlisted = [a for a in assets if not any(fnmatch(a, pattern) for pattern in patterns)]
    assert not unlisted, f"add {unlisted} to [tool.setuptools.package-data] engine.ui"
