"""schemas/README.md stays true to the schemas and to the producer programs it shows.

The fingerprint table lists exactly the current schemas' fingerprints; no fingerprint written
anywhere in the README or the recipes (a hex string or a ``\\xc3\\x01...`` header) is stale,
since a producer copying one would send every record to dead letters; and each code block
marked ``<!-- excerpt: PATH -->`` consists of lines of that program, so the essential lines
shown are the ones ``tests/integration/test_recipes.py`` runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.codec import known_schemas

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
README = SCHEMAS / "README.md"
TEXT = README.read_text(encoding="utf-8")
RECIPE_FILES = sorted(
    p for p in (SCHEMAS / "recipes").rglob("*") if p.suffix in {".java", ".go", ".sh", ".py"}
)
TABLE_ROW = re.compile(r"^\| (\w+) \| `([0-9a-f]{16})` \|$", re.MULTILINE)
HEX_FINGERPRINT = re.compile(r"(?<![0-9a-fA-F])[0-9a-f]{16}(?![0-9a-fA-F])")
HEADER_LITERAL = re.compile(r"\\\\?xc3\\\\?x01((?:\\\\?x[0-9a-fA-F]{2}){8})")
EXCERPT = re.compile(r"<!-- excerpt: (\S+) -->\n```\w+\n(.*?)\n```", re.DOTALL)
RECIPES_SECTION = TEXT[TEXT.index("## Producing from other languages") : TEXT.index("## Command")]


def _current() -> dict[str, str]:
    return {s.name: s.fingerprint for s in known_schemas() if s.version == "current"}


def test_the_fingerprint_table_lists_the_current_fingerprints() -> None:
    assert dict(TABLE_ROW.findall(TEXT)) == _current()


@pytest.mark.parametrize("path", [README, *RECIPE_FILES], ids=lambda p: p.name)
def test_no_stale_fingerprint_is_written_down(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    written = set(HEX_FINGERPRINT.findall(text))
    written |= {re.sub(r"\\\\?x", "", h).lower() for h in HEADER_LITERAL.findall(text)}
    assert written <= set(_current().values()), (
        f"{path.name} writes fingerprints that no current schema has: "
        f"{sorted(written - set(_current().values()))}; compute the header from the schema "
        f"file, or copy it from known_schemas()"
    )


def test_every_recipe_block_is_an_excerpt_of_its_program() -> None:
    fenced = re.findall(r"^```\w+$", RECIPES_SECTION, re.MULTILINE)
    excerpts = EXCERPT.findall(RECIPES_SECTION)
    assert len(excerpts) == len(fenced) == 4, "each recipe shows one excerpt of its program"
    for path, block in excerpts:
        program = {line.strip() for line in (SCHEMAS / path).read_text().splitlines()}
        missing = [line for line in block.splitlines() if line.strip() not in program]
        assert not missing, f"schemas/README.md shows lines that {path} lacks: {missing}"
