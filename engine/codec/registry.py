"""The Avro schemas the engine knows: the current ones in ``schemas/`` and every released
version kept in ``schemas/released/<version>/``, indexed by fingerprint.

Every record on the wire starts with the single-object-encoding header (``C3 01`` followed
by the 8-byte little-endian CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical
Form), so a reader can always tell which schema wrote it. Records written with a released
schema stay readable forever: the registry resolves them against the current schema.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from engine.codec.contracts import SCHEMAS, contract_dir
from engine.core.errors import CodecError

MARKER = b"\xc3\x01"
HEADER_SIZE = 10
SCHEMA_DIR_ENV = "TURNSTILE_SCHEMA_DIR"

HISTORY = "HistoryEvent"
COMMAND = "Command"
#: Every top-level schema file, by record name. Messages are everything but history.
MESSAGE_SCHEMAS = (
    COMMAND,
    "ChildResult",
    "ActivityTask",
    "ActivityResult",
    "InstanceStatus",
    "DeadLetter",
    "CommandOutcome",
    "ActivityCancel",
)
#: The processor's own table rows (state changelog), not messages between components.
INSTANCE_ROW = "InstanceRow"
STATE_SCHEMAS = (INSTANCE_ROW,)
ALL_SCHEMAS = (HISTORY, *MESSAGE_SCHEMAS, *STATE_SCHEMAS)


def schema_dir() -> Path:
    """The installed schemas (see :mod:`engine.codec.contracts`), unless
    ``TURNSTILE_SCHEMA_DIR`` says where."""
    override = os.environ.get(SCHEMA_DIR_ENV)
    if override:
        return Path(override)
    return contract_dir(SCHEMAS)


@dataclass(frozen=True)
class WriterSchema:
    """One version of one top-level schema."""

    name: str
    version: str
    #: The JSON as written in the .avsc file (docs, defaults and logical types included).
    raw: dict[str, Any]
    #: fastavro-parsed, with logical types removed so that timestamps stay plain ints; the
    #: encoded bytes and the fingerprint are the same either way.
    parsed: dict[str, Any]
    fingerprint: bytes

    @property
    def header(self) -> bytes:
        return MARKER + self.fingerprint


def strip_logical_types(schema: Any) -> Any:
    """A copy of a schema JSON without ``logicalType`` annotations."""
    if isinstance(schema, dict):
        return {k: strip_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [strip_logical_types(v) for v in schema]
    return schema


def parse_record(schema: Any) -> dict[str, Any]:
    """fastavro's parse of a top-level record schema (as a dict, for the type checker)."""
    parsed = parse_schema(schema)
    if not isinstance(parsed, dict):
        raise CodecError(f"expected a record schema, got {type(parsed).__name__}")
    return parsed


def schema_fingerprint(schema: Any) -> bytes:
    """CRC-64-AVRO of the Parsing Canonical Form, little-endian, as the header carries it."""
    canonical = to_parsing_canonical_form(parse_schema(schema))
    return bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))


def load_schema_file(path: Path, version: str) -> WriterSchema:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CodecError(
            f"Avro schema {path} is missing; reinstall the engine, or point "
            f"{SCHEMA_DIR_ENV} at a folder with every schema"
        ) from None
    except ValueError as exc:
        raise CodecError(f"Avro schema {path} is not valid JSON: {exc}") from exc
    raw = with_references(raw, path.parent)
    try:
        parsed = parse_record(strip_logical_types(raw))
    except Exception as exc:  # fastavro raises several unrelated types for bad schemas
        raise CodecError(f"Avro schema {path} is not a valid schema: {exc}") from exc
    return WriterSchema(path.stem, version, raw, parsed, schema_fingerprint(raw))


_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAMED = frozenset({"record", "error", "enum", "fixed"})


def with_references(raw: Any, directory: Path) -> Any:
    """The schema with each named type it uses but does not define read in, at its first
    use, from the file of that name beside it (``io.turnstile.Command`` from
    ``Command.avsc``).

    So a type is written in one file only (``InstanceRow.avsc`` refers to the Command
    union instead of copying it), while the engine still works with one whole schema per
    record: the expanded schema is what Avro's Parsing Canonical Form sees, so the
    fingerprint is the one a copy would have had. A name with no such file is left for
    the Avro parser to report."""
    defined: set[str] = set()

    def full_name(name: str, namespace: str) -> str:
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def walk(node: Any, namespace: str) -> Any:
        if isinstance(node, str):
            full = full_name(node, namespace)
            if node in _PRIMITIVES or full in defined:
                return node
            path = directory / f"{full.rsplit('.', 1)[-1]}.avsc"
            if not path.is_file():
                return node
            return walk(json.loads(path.read_text(encoding="utf-8")), namespace)
        if isinstance(node, list):
            return [walk(branch, namespace) for branch in node]
        if not isinstance(node, dict):
            return node
        kind = node.get("type")
        if kind in _NAMED and "name" in node:
            full = full_name(node["name"], node.get("namespace", namespace))
            defined.add(full)
            inner = full.rsplit(".", 1)[0] if "." in full else ""
            if "fields" not in node:
                return node
            fields = [{**f, "type": walk(f["type"], inner)} for f in node["fields"]]
            return {**node, "fields": fields}
        out = dict(node)
        for key in ("type", "items", "values"):
            if key in out:
                out[key] = walk(out[key], namespace)
        return out

    return walk(raw, "")


def load_current(directory: Path | None = None) -> dict[str, WriterSchema]:
    base = directory or schema_dir()
    return {name: load_schema_file(base / f"{name}.avsc", "current") for name in ALL_SCHEMAS}


def released_versions(directory: Path | None = None) -> list[str]:
    """Released version folder names, oldest first (numeric names sort numerically)."""
    released = (directory or schema_dir()) / "released"
    if not released.is_dir():
        return []
    names = [p.name for p in released.iterdir() if p.is_dir()]
    return sorted(names, key=lambda n: (0, int(n), n) if n.isdigit() else (1, 0, n))


def load_released(directory: Path | None = None) -> Iterator[WriterSchema]:
    """Every schema file of every released version."""
    base = directory or schema_dir()
    for version in released_versions(base):
        for path in sorted((base / "released" / version).glob("*.avsc")):
            yield load_schema_file(path, version)
