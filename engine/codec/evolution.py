"""The schema evolution rules, as a checker that CI runs against every released version.

Records stay on Kafka for years (history is the audit record), and producers in other
languages upgrade on their own schedule, so a schema change must keep old records readable
by the new engine and new records readable by old engines. The rules (schemas/README.md):

- add a field only with a default; never remove, retype or reuse a field;
- rename a record, enum or field only with an alias carrying the old name;
- add union branches and enum symbols only at the end, never remove one;
- every enum has a default symbol;
- the HistoryEvent hash field stays last (the hash covers the bytes before it);
- a named type shared by several files has one definition everywhere.

Two kinds of checks: structural comparison (which rule was broken, and where), and
resolution of generated sample records written with the old schema and read with the new
one by fastavro (the behaviour every Avro reader must show).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from fastavro.schema import to_parsing_canonical_form

from engine.codec.registry import (
    HISTORY,
    WriterSchema,
    load_current,
    load_released,
    parse_record,
    strip_logical_types,
)

_NAMED_KINDS = frozenset({"record", "enum", "fixed"})


@dataclass(frozen=True)
class Violation:
    schema: str
    path: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.schema}: {self.path}: [{self.rule}] {self.message}"


@dataclass
class _Walk:
    schema: str
    old_named: Mapping[str, Any]
    new_named: Mapping[str, Any]
    found: list[Violation] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)

    def flag(self, path: str, rule: str, message: str) -> None:
        self.found.append(Violation(self.schema, path, rule, message))


def _parsed(schema: Any) -> dict[str, Any]:
    return parse_record(schema)


def _resolve(schema: Any, named: Mapping[str, Any]) -> Any:
    if isinstance(schema, str) and schema in named:
        return named[schema]
    if isinstance(schema, dict) and schema.get("type") not in (*_NAMED_KINDS, "array", "map"):
        return schema["type"]
    return schema


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    return str(schema["type"]) if isinstance(schema, dict) else str(schema)


def _label(schema: Any) -> str:
    kind = _kind(schema)
    return str(schema["name"]) if kind in _NAMED_KINDS else kind


def _same_name(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return bool(old["name"] == new["name"] or old["name"] in _full_aliases(new))


def _full_aliases(schema: Mapping[str, Any]) -> list[str]:
    namespace = schema["name"].rpartition(".")[0]
    return [
        a if "." in a or not namespace else f"{namespace}.{a}" for a in schema.get("aliases", [])
    ]


# --- structural rules ---------------------------------------------------------------------


def check_evolution(old: Any, new: Any, name: str = "") -> list[Violation]:
    """Every rule that ``new`` breaks relative to ``old`` (both schema JSON documents)."""
    old_p, new_p = _parsed(old), _parsed(new)
    walk = _Walk(
        name or _label(new_p), old_p.get("__named_schemas", {}), new_p.get("__named_schemas", {})
    )
    _compare(walk, old_p, new_p, _label(new_p))
    walk.found.extend(check_current(new, name))
    return walk.found


def check_current(schema: Any, name: str = "") -> list[Violation]:
    """Rules that hold for one schema on its own: enum defaults, the history hash field."""
    parsed = _parsed(schema)
    walk = _Walk(name or _label(parsed), {}, parsed.get("__named_schemas", {}))
    for type_name, named in walk.new_named.items():
        if named["type"] == "enum" and named.get("default") not in named["symbols"]:
            walk.flag(
                type_name,
                "enum-default",
                "enum needs a default symbol so that readers can read symbols added later",
            )
    if parsed["name"].endswith("." + HISTORY) or parsed["name"] == HISTORY:
        names = [f["name"] for f in parsed["fields"]]
        if not names or names[-1] != "hash":
            walk.flag(
                parsed["name"],
                "hash-last",
                f"the hash field must stay the last field "
                f"(fields are {names}); add new envelope fields before it",
            )
    return walk.found


def _compare(walk: _Walk, old: Any, new: Any, path: str) -> None:
    old = _resolve(old, walk.old_named)
    new = _resolve(new, walk.new_named)
    old_kind, new_kind = _kind(old), _kind(new)
    if old_kind != new_kind:
        walk.flag(
            path,
            "retyped",
            f"type changed from {_label(old)} to {_label(new)}; add a "
            f"new field with a default instead",
        )
    elif old_kind == "union":
        _compare_union(walk, old, new, path)
    elif old_kind in _NAMED_KINDS:
        _compare_named(walk, old, new, path)
    elif old_kind == "array":
        _compare(walk, old["items"], new["items"], f"{path}[]")
    elif old_kind == "map":
        _compare(walk, old["values"], new["values"], f"{path}{{}}")


def _compare_named(walk: _Walk, old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> None:
    if not _same_name(old, new):
        walk.flag(
            path,
            "renamed",
            f"{old['name']} became {new['name']} without an alias; add "
            f'"aliases": ["{old["name"]}"]',
        )
        return
    key = (old["name"], new["name"])
    if key in walk.seen:
        return
    walk.seen.add(key)
    if old["type"] == "record":
        _compare_fields(walk, old, new, path)
    elif old["type"] == "enum":
        _compare_enum(walk, old, new, path)
    elif old["size"] != new["size"]:
        walk.flag(path, "retyped", f"fixed size changed from {old['size']} to {new['size']}")


def _compare_fields(walk: _Walk, old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> None:
    by_name = {f["name"]: f for f in new["fields"]}
    by_alias = {a: f for f in new["fields"] for a in f.get("aliases", [])}
    matched: set[str] = set()
    for old_field in old["fields"]:
        name = old_field["name"]
        new_field = by_name.get(name) or by_alias.get(name)
        here = f"{path}.{name}"
        if new_field is None:
            walk.flag(
                here,
                "field-removed",
                "field removed; keep it (old records and old "
                "readers rely on it) and stop filling it instead",
            )
            continue
        matched.add(new_field["name"])
        if "default" in old_field and "default" not in new_field:
            walk.flag(here, "default-removed", "the field lost its default")
        _compare(walk, old_field["type"], new_field["type"], here)
    for new_field in new["fields"]:
        if new_field["name"] not in matched and "default" not in new_field:
            walk.flag(
                f"{path}.{new_field['name']}",
                "field-without-default",
                "new field has no default; old records lack it, so give it one",
            )


def _compare_enum(walk: _Walk, old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> None:
    old_symbols, new_symbols = list(old["symbols"]), list(new["symbols"])
    if new_symbols[: len(old_symbols)] != old_symbols:
        walk.flag(
            path,
            "enum-symbols",
            f"symbols {old_symbols} must stay, in order, at the "
            f"start of {new_symbols}; add new symbols at the end only",
        )


def _compare_union(walk: _Walk, old: list[Any], new: list[Any], path: str) -> None:
    old_r = [_resolve(b, walk.old_named) for b in old]
    new_r = [_resolve(b, walk.new_named) for b in new]
    for i, old_branch in enumerate(old_r):
        if i < len(new_r) and _same_branch(old_branch, new_r[i]):
            _compare(walk, old_branch, new_r[i], f"{path}<{_short(_label(old_branch))}>")
        elif i < len(new_r) and _renamed(old_branch, new_r[i], new_r):
            walk.flag(
                f"{path}<{_short(_label(old_branch))}>",
                "renamed",
                f"{_label(old_branch)} became {_label(new_r[i])} without an alias; add "
                f'"aliases": ["{_label(old_branch)}"]',
            )
        else:
            now = _label(new_r[i]) if i < len(new_r) else "missing"
            walk.flag(
                path,
                "union-branches",
                f"branch #{i} was {_label(old_branch)}, now {now}; "
                f"add new branches at the end only and never remove one",
            )
            return


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _renamed(old: Any, new: Any, all_new: list[Any]) -> bool:
    """Same kind of named type at the same position, and the old name is gone."""
    if _kind(old) not in _NAMED_KINDS or _kind(old) != _kind(new):
        return False
    return not any(_kind(b) == _kind(old) and _same_name(old, b) for b in all_new)


def _same_branch(old: Any, new: Any) -> bool:
    if _kind(old) != _kind(new):
        return False
    if _kind(old) in _NAMED_KINDS:
        return _same_name(old, new)
    return True


def check_shared_types(schemas: Iterable[WriterSchema]) -> list[Violation]:
    """A named type used by several files must be defined identically in each."""
    seen: dict[str, tuple[str, str]] = {}
    found: list[Violation] = []
    for schema in schemas:
        for type_name, named in schema.parsed.get("__named_schemas", {}).items():
            canonical = to_parsing_canonical_form(_standalone(named, schema.parsed))
            first = seen.setdefault(type_name, (schema.name, canonical))
            if first[1] != canonical:
                found.append(
                    Violation(
                        schema.name,
                        type_name,
                        "shared-type",
                        f"defined differently than in {first[0]}.avsc; keep one definition",
                    )
                )
    return found


def _standalone(named: Mapping[str, Any], root: Mapping[str, Any]) -> Any:
    """A named type as a schema of its own (with the named types it refers to)."""
    return {**named, "__named_schemas": root.get("__named_schemas", {}), "__fastavro_parsed": True}


# --- resolution of sample records ---------------------------------------------------------


def sample_records(schema: Any, count: int, seed: int = 0) -> list[Any]:
    """``count`` datums that cover every union branch and enum symbol of ``schema``."""
    parsed = _parsed(schema)
    sampler = _Sampler(random.Random(seed), parsed.get("__named_schemas", {}))
    return [sampler.value(parsed, 0) for _ in range(count)]


@dataclass
class _Sampler:
    rng: random.Random
    named: Mapping[str, Any]
    turns: dict[int, int] = field(default_factory=dict)

    def turn(self, node: Any, size: int) -> int:
        """Cycle through the choices of one schema node, so every branch gets used."""
        index = self.turns.get(id(node), self.rng.randrange(size))
        self.turns[id(node)] = index + 1
        return index % size

    def value(self, schema: Any, depth: int) -> Any:
        schema = _resolve(schema, self.named)
        kind = _kind(schema)
        if kind == "union":
            return self.union(schema, depth)
        if kind == "record":
            return {f["name"]: self.value(f["type"], depth + 1) for f in schema["fields"]}
        if kind == "enum":
            return schema["symbols"][self.turn(schema, len(schema["symbols"]))]
        if kind == "fixed":
            return self.rng.randbytes(schema["size"])
        if kind == "array":
            return [self.value(schema["items"], depth + 1) for _ in range(self.rng.randrange(3))]
        if kind == "map":
            return {
                f"k{i}": self.value(schema["values"], depth + 1)
                for i in range(self.rng.randrange(3))
            }
        return self.primitive(kind)

    def union(self, branches: list[Any], depth: int) -> Any:
        resolved = [_resolve(b, self.named) for b in branches]
        kinds = [_kind(b) for b in resolved]
        index = (
            kinds.index("null")
            if depth > 6 and "null" in kinds
            else self.turn(branches, len(branches))
        )
        chosen = resolved[index]
        datum = self.value(chosen, depth + 1)
        return (chosen["name"], datum) if _kind(chosen) == "record" else datum

    def primitive(self, kind: str) -> Any:
        rng = self.rng
        values: dict[str, Any] = {
            "null": None,
            "boolean": rng.random() < 0.5,
            "int": rng.choice([0, 1, -1, rng.randint(-(2**31), 2**31 - 1)]),
            "long": rng.choice([0, 63, -64, rng.randint(-(2**63), 2**63 - 1)]),
            "float": rng.random(),
            "double": rng.random(),
            "bytes": rng.randbytes(rng.randrange(40)),
            "string": "".join(rng.choice("abcé€𝄞 ") for _ in range(rng.randrange(12))),
        }
        return values[kind]


def check_resolution(old: Any, new: Any, name: str = "", samples: int = 200) -> list[Violation]:
    """Write sample records with ``old``, read them with ``new``: every one must resolve.

    Logical types are left out: they do not take part in resolution, and random longs are
    not valid timestamps.
    """
    old, new = strip_logical_types(old), strip_logical_types(new)
    old_p, new_p = _parsed(old), _parsed(new)
    found: list[Violation] = []
    for datum in sample_records(old, samples):
        buffer = BytesIO()
        schemaless_writer(buffer, old_p, datum)
        buffer.seek(0)
        try:
            schemaless_reader(buffer, old_p, new_p)
        except Exception as exc:  # fastavro's resolution errors have several types
            found.append(
                Violation(
                    name or _label(new_p),
                    _label(new_p),
                    "resolution",
                    f"a record written with the old schema does not resolve: "
                    f"{type(exc).__name__}: {exc}",
                )
            )
            break
    return found


def check_all(directory: Path | None = None) -> list[Violation]:
    """Every rule, for every current schema against every released version of it."""
    current = load_current(directory)
    found = check_shared_types(current.values())
    for schema in current.values():
        found.extend(check_current(schema.raw, schema.name))
    for old in load_released(directory):
        new = current.get(old.name)
        if new is None:
            found.append(
                Violation(
                    old.name,
                    old.name,
                    "schema-removed",
                    f"released in version {old.version} but missing from schemas/; keep it",
                )
            )
            continue
        label = f"{old.name} (released {old.version} -> current)"
        found.extend(check_evolution(old.raw, new.raw, label))
        found.extend(check_resolution(old.raw, new.raw, label))
    return found
