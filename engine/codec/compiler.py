"""Compiles an Avro schema into straight-line Python that encodes core objects to Avro
binary and decodes them back, without fastavro's per-record interpretation and without
intermediate dicts.

Why: replay has to reach 200k events/s per core including decoding, which leaves a few
microseconds per event. fastavro walks the schema for every record and then the dicts still
have to become dataclasses; that alone costs about 10 µs for a small history event. The
generated functions do the same work in a fraction of that (see benchmarks/codec_bench.py).

fastavro remains the reference implementation: property tests check that both produce the
same bytes and the same values, and records written with older schemas go through
fastavro's schema resolution instead of this code.

Generated readers take ``(buf, pos)`` and return ``(value, new_pos)``; writers take
``(out: bytearray, value)`` and append. Readers index ``buf`` directly; any structural
problem surfaces as IndexError, UnicodeDecodeError, struct.error or MalformedRecordError,
which the caller turns into one MalformedRecordError with context.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, is_dataclass
from itertools import count
from typing import Any

from engine.codec.bindings import (
    LIFTED_FIELDS,
    RecordBinding,
    Schema,
    check_record_fields,
    enum_binding,
    record_binding,
)
from engine.core.errors import CodecError, MalformedRecordError

Reader = Callable[[bytes, int], tuple[Any, int]]
Writer = Callable[[bytearray, Any], None]

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1

#: Raw first byte -> zig-zag decoded value, for one-byte varints; None means "more bytes".
_ZZ: tuple[int | None, ...] = tuple(((b >> 1) ^ -(b & 1)) if b < 0x80 else None for b in range(256))
#: Raw first byte -> length, for one-byte non-negative lengths; None means "slow path".
_LEN: tuple[int | None, ...] = tuple(b >> 1 if b < 0x80 and not b & 1 else None for b in range(256))
_BOOL = (False, True)
#: What a generated reader raises on bytes that do not follow the schema.
READ_ERRORS = (IndexError, UnicodeDecodeError, struct.error, MalformedRecordError, RecursionError)


# --- runtime helpers used by the generated code -------------------------------------------


def _bad(what: str) -> MalformedRecordError:
    return MalformedRecordError(what)


def _read_varint(buf: bytes, pos: int, n: int, shift: int) -> tuple[int, int]:
    """The general loop, for varints longer than the unrolled part of ``_rlong``."""
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            if n >> 64:
                raise _bad("variable-length integer overflows 64 bits")
            return (n >> 1) ^ -(n & 1), pos
        shift += 7
        if shift >= 70:
            raise _bad("variable-length integer longer than 10 bytes")


def _rlong(buf: bytes, pos: int) -> tuple[int, int]:
    """Unrolled up to six bytes: a millisecond timestamp (in every history envelope) takes
    six, and a straight run of tests is a fifth faster than the loop."""
    b = buf[pos]
    n = b & 0x7F
    if b < 0x80:
        return (n >> 1) ^ -(n & 1), pos + 1
    b = buf[pos + 1]
    n |= (b & 0x7F) << 7
    if b < 0x80:
        return (n >> 1) ^ -(n & 1), pos + 2
    b = buf[pos + 2]
    n |= (b & 0x7F) << 14
    if b < 0x80:
        return (n >> 1) ^ -(n & 1), pos + 3
    b = buf[pos + 3]
    n |= (b & 0x7F) << 21
    if b < 0x80:
        return (n >> 1) ^ -(n & 1), pos + 4
    b = buf[pos + 4]
    n |= (b & 0x7F) << 28
    if b < 0x80:
        return (n >> 1) ^ -(n & 1), pos + 5
    b = buf[pos + 5]
    n |= (b & 0x7F) << 35
    if b < 0x80:
        return (n >> 1) ^ -(n & 1), pos + 6
    return _read_varint(buf, pos + 6, n, 42)


def _rint(buf: bytes, pos: int) -> tuple[int, int]:
    value, pos = _rlong(buf, pos)
    if not _INT_MIN <= value <= _INT_MAX:
        raise _bad(f"int value {value} out of 32-bit range")
    return value, pos


def _rlen(buf: bytes, pos: int) -> tuple[int, int]:
    value, pos = _rlong(buf, pos)
    if value < 0:
        raise _bad(f"negative length {value}")
    return value, pos


def _wlong(out: bytearray, value: int) -> None:
    if not _LONG_MIN <= value <= _LONG_MAX:
        raise OverflowError(f"{value} does not fit an Avro long (64-bit)")
    n = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _wint(out: bytearray, value: int) -> None:
    if not _INT_MIN <= value <= _INT_MAX:
        raise OverflowError(f"{value} does not fit an Avro int (32-bit)")
    _wlong(out, value)


def _noop_write(out: bytearray, value: Any) -> None:
    return None


# --- code generation ----------------------------------------------------------------------


@dataclass
class _Lines:
    rows: list[str] = field(default_factory=list)

    def add(self, indent: int, text: str) -> None:
        self.rows.append("    " * indent + text)


@dataclass(frozen=True)
class Compiled:
    """The entry points for one top-level schema, plus the generated source for debugging."""

    read: Reader
    write: Writer
    source: str


class _Compiler:
    """Generates one reader and one writer function per named record of a schema."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.named: dict[str, Any] = dict(schema.get("__named_schemas", {}))
        self.ns: dict[str, Any] = {
            "ZZ": _ZZ,
            "LEN": _LEN,
            "BOOL": _BOOL,
            "rlong": _rlong,
            "rint": _rint,
            "rlen": _rlen,
            "wlong": _wlong,
            "wint": _wint,
            "bad": _bad,
            "NEW": object.__new__,
            "unpack_f": struct.Struct("<f").unpack_from,
            "unpack_d": struct.Struct("<d").unpack_from,
            "pack_f": struct.Struct("<f").pack,
            "pack_d": struct.Struct("<d").pack,
        }
        self.ids = count()
        #: Bytes of a varint read inline before calling the general reader.
        self.wide_varints = 2
        self.func_ids: dict[str, int] = {}
        self.pending: list[str] = []
        self.out = _Lines()
        #: Union dispatch tables name functions that exist only once the source has run.
        self.read_tables: list[tuple[str, list[str]]] = []
        self.write_tables: list[tuple[str, list[tuple[str, int, str]]]] = []

    # helpers ------------------------------------------------------------------------------

    def const(self, value: Any, prefix: str) -> str:
        name = f"{prefix}{next(self.ids)}"
        self.ns[name] = value
        return name

    def tmp(self, prefix: str) -> str:
        return f"{prefix}{next(self.ids)}"

    def resolve(self, schema: Schema) -> Schema:
        if isinstance(schema, str) and schema in self.named:
            return self.named[schema]
        if isinstance(schema, dict) and schema.get("type") in _PRIMITIVES:
            return schema["type"]  # annotated primitive, e.g. a logical type
        return schema

    def record_id(self, name: str) -> int:
        if name not in self.func_ids:
            self.func_ids[name] = len(self.func_ids)
            self.pending.append(name)
        return self.func_ids[name]

    def run(self, root: Mapping[str, Any]) -> Compiled:
        if root.get("type") != "record":
            raise CodecError("only record schemas can be compiled")
        self.named.setdefault(root["name"], root)
        root_id = self.record_id(root["name"])
        while self.pending:
            name = self.pending.pop()
            self.emit_record(name, self.named[name])
        source = "\n".join(self.out.rows) + "\n"
        exec(compile(source, f"<avro codec {root['name']}>", "exec"), self.ns)
        self.link_tables()
        return Compiled(self.ns[f"r{root_id}"], self.ns[f"w{root_id}"], source)

    def link_tables(self) -> None:
        ns = self.ns
        for name, readers in self.read_tables:
            ns[name] = tuple(ns[r] for r in readers)
        for name, entries in self.write_tables:
            ns[name] = {ns[cls]: (tag, ns[fn]) for cls, tag, fn in entries}

    # records ------------------------------------------------------------------------------

    def emit_record(self, name: str, schema: Mapping[str, Any]) -> None:
        check_record_fields(name, schema)
        binding = record_binding(name)
        rid = self.func_ids[name]
        self.emit_record_reader(rid, schema, binding)
        self.emit_record_writer(rid, schema, binding)

    def emit_record_reader(self, rid: int, schema: Mapping[str, Any], b: RecordBinding) -> None:
        lifted = "".join(f", {n}" for n in b.lifted)
        self.out.add(0, f"def r{rid}(buf, pos{lifted}):")
        own: list[tuple[str, str]] = []
        for f in schema["fields"]:
            var = self.tmp("v")
            if f["name"] == b.self_field:
                if [n for n, _ in own] != list(LIFTED_FIELDS):
                    raise CodecError(
                        f"{schema['name']}: {LIFTED_FIELDS} must precede {b.self_field}"
                    )
                self.read_union(f["type"], var, 1, lifted_args=[v for _, v in own])
                self.out.add(1, f"return {var}, pos")
                self.out.add(0, "")
                return
            self.read_value(f["type"], var, 1)
            own.append((f["name"], var))
        self.construct(b, [*((n, n) for n in b.lifted), *own], "o", 1)
        self.out.add(1, "return o, pos")
        self.out.add(0, "")

    def construct(
        self, b: RecordBinding, values: list[tuple[str, str]], target: str, ind: int
    ) -> None:
        """Build the object without the frozen dataclass's ``__init__`` (which assigns the
        fields one by one through ``object.__setattr__``): the fields are stored into a bare
        instance of an unfrozen twin of the class, which then takes the class's identity
        (same slots, same base, so the layout is the same), or else through the slots'
        setters. The twin is half the cost of the setters, a third of ``__init__``."""
        cls = b.cls
        assert cls is not None
        cname = self.const(cls, "C")
        if is_dataclass(cls) and "__slots__" in vars(cls) and not hasattr(cls, "__post_init__"):
            twin = _twin(cls)
            if twin is not None:
                self.out.add(ind, f"{target} = NEW({self.const(twin, 'T')})")
                for fname, var in values:
                    self.out.add(ind, f"{target}.{fname} = {var}")
                self.out.add(ind, f"{target}.__class__ = {cname}")
                return
            self.out.add(ind, f"{target} = NEW({cname})")
            for fname, var in values:
                setter = self.const(getattr(cls, fname).__set__, "S")
                self.out.add(ind, f"{setter}({target}, {var})")
        else:
            kwargs = ", ".join(f"{fname}={var}" for fname, var in values)
            self.out.add(ind, f"{target} = {cname}({kwargs})")

    def inlinable(self, schema: Mapping[str, Any]) -> bool:
        """Small, non-recursive plain records are read and written in their parent's code,
        saving a call per record (a Payload sits in almost every event)."""
        binding = record_binding(schema["name"])
        if binding.cls is None or binding.lifted or len(schema["fields"]) > 4:
            return False
        check_record_fields(schema["name"], schema)
        seen: set[str] = set()
        for f in schema["fields"]:
            self.reachable(f["type"], seen)
        return schema["name"] not in seen

    def reachable(self, schema: Any, seen: set[str]) -> None:
        """Collect the names of the named types ``schema`` can contain."""
        if isinstance(schema, str) and schema in self.named:
            schema = self.named[schema]
        if isinstance(schema, list):
            for branch in schema:
                self.reachable(branch, seen)
            return
        if not isinstance(schema, dict):
            return
        if "name" in schema:
            if schema["name"] in seen:
                return
            seen.add(schema["name"])
        if schema["type"] == "record":
            for f in schema["fields"]:
                self.reachable(f["type"], seen)
        elif schema["type"] in ("array", "map"):
            self.reachable(schema.get("items", schema.get("values")), seen)

    def emit_record_writer(self, rid: int, schema: Mapping[str, Any], b: RecordBinding) -> None:
        self.out.add(0, f"def w{rid}(out, o):")
        before = len(self.out.rows)
        self.write_fields(schema, b, "o", 1)
        if len(self.out.rows) == before:
            self.out.add(1, "pass")
        self.out.add(0, "")

    def write_fields(self, schema: Mapping[str, Any], b: RecordBinding, obj: str, ind: int) -> None:
        for f in schema["fields"]:
            if f["name"] in b.lifted:
                continue
            if f["name"] == b.self_field:
                self.write_value(f["type"], obj, ind)
                continue
            var = self.tmp("x")
            self.out.add(ind, f"{var} = {obj}.{f['name']}")
            self.write_value(f["type"], var, ind)

    # readers ------------------------------------------------------------------------------

    def read_value(self, schema: Schema, var: str, ind: int) -> None:
        schema = self.resolve(schema)
        if isinstance(schema, list):
            self.read_union(schema, var, ind)
        elif isinstance(schema, str):
            self.read_primitive(schema, var, ind)
        else:
            self.read_complex(schema, var, ind)

    def read_primitive(self, kind: str, var: str, ind: int) -> None:
        add = self.out.add
        if kind == "null":
            add(ind, f"{var} = None")
        elif kind == "boolean":
            add(ind, f"{var} = BOOL[buf[pos]]")
            add(ind, "pos += 1")
        elif kind in ("int", "long"):
            self.read_varint(var, ind, "rint" if kind == "int" else "rlong")
        elif kind in ("float", "double"):
            size = 4 if kind == "float" else 8
            add(ind, f"{var} = unpack_{kind[0]}(buf, pos)[0]")
            add(ind, f"pos += {size}")
        elif kind in ("bytes", "string"):
            self.read_bytes(var, ind, decode=kind == "string")
        else:
            raise CodecError(f"unsupported Avro type {kind!r}")

    def read_varint(self, var: str, ind: int, slow: str) -> None:
        """Short varints inline (two bytes: sequence numbers and task ids below 8192; up to
        ``wide_varints`` bytes where the bulk decoder asks, for millisecond timestamps),
        longer ones through ``slow``: a call saved per field on most history events."""
        add = self.out.add
        b, n = self.tmp("b"), self.tmp("n")
        width = min(self.wide_varints, 4 if slow == "rint" else 9)  # 4 x 7 bits fit an int
        add(ind, f"{var} = ZZ[buf[pos]]")
        add(ind, f"if {var} is None:")
        add(ind + 1, f"{n} = buf[pos] & 127")
        for i in range(1, width):
            inner = ind + i
            add(inner, f"{b} = buf[pos + {i}]")
            add(inner, f"if {b} < 128:")
            add(inner + 1, f"{n} |= {b} << {7 * i}")
            add(inner + 1, f"{var} = ({n} >> 1) ^ -({n} & 1)")
            add(inner + 1, f"pos += {i + 1}")
            add(inner, "else:")
            if i < width - 1:
                add(inner + 1, f"{n} |= ({b} & 127) << {7 * i}")
        add(ind + width, f"{var}, pos = {slow}(buf, pos)")
        add(ind, "else:")
        add(ind + 1, "pos += 1")

    def read_bytes(self, var: str, ind: int, decode: bool) -> None:
        add = self.out.add
        n = self.tmp("n")
        add(ind, f"{n} = LEN[buf[pos]]")
        add(ind, f"if {n} is None:")
        add(ind + 1, f"{n}, pos = rlen(buf, pos)")
        add(ind, "else:")
        add(ind + 1, "pos += 1")
        add(ind, f"{var} = buf[pos:pos + {n}]{'.decode()' if decode else ''}")
        add(ind, f"pos += {n}")

    def read_complex(self, schema: Mapping[str, Any], var: str, ind: int) -> None:
        kind = schema["type"]
        if kind == "record" and self.inlinable(schema):
            binding = record_binding(schema["name"])
            values = []
            for f in schema["fields"]:
                fvar = self.tmp("v")
                self.read_value(f["type"], fvar, ind)
                values.append((f["name"], fvar))
            self.construct(binding, values, var, ind)
        elif kind == "record":
            rid = self.record_id(schema["name"])
            self.out.add(ind, f"{var}, pos = r{rid}(buf, pos)")
        elif kind == "enum":
            self.read_enum(schema, var, ind)
        elif kind == "fixed":
            self.out.add(ind, f"{var} = buf[pos:pos + {schema['size']}]")
            self.out.add(ind, f"pos += {schema['size']}")
        elif kind in ("array", "map"):
            self.read_blocks(schema, var, ind)
        else:
            raise CodecError(f"unsupported Avro type {kind!r}")

    def read_enum(self, schema: Mapping[str, Any], var: str, ind: int) -> None:
        enum_cls = enum_binding(schema["name"])
        members = tuple(enum_cls(s) for s in schema["symbols"])
        table = self.const(members, "E")
        idx = self.tmp("i")
        self.read_primitive("int", idx, ind)
        self.out.add(ind, f"if not 0 <= {idx} < {len(members)}:")
        self.out.add(ind + 1, f"raise bad(f'enum index {{{idx}}} out of range')")
        self.out.add(ind, f"{var} = {table}[{idx}]")

    def read_blocks(self, schema: Mapping[str, Any], var: str, ind: int) -> None:
        """Arrays and maps: blocks of items, a negative count carries a byte size."""
        add = self.out.add
        is_map = schema["type"] == "map"
        cnt, item, key = self.tmp("c"), self.tmp("it"), self.tmp("k")
        add(ind, f"{var} = {{}}" if is_map else f"{var} = []")
        add(ind, "while True:")
        self.read_primitive("long", cnt, ind + 1)
        add(ind + 1, f"if {cnt} == 0:")
        add(ind + 2, "break")
        add(ind + 1, f"if {cnt} < 0:")
        add(ind + 2, f"{cnt} = -{cnt}")
        add(ind + 2, "_, pos = rlong(buf, pos)")
        add(ind + 1, f"for _ in range({cnt}):")
        if is_map:
            self.read_bytes(key, ind + 2, decode=True)
            self.read_value(schema["values"], item, ind + 2)
            add(ind + 2, f"{var}[{key}] = {item}")
        else:
            self.read_value(schema["items"], item, ind + 2)
            add(ind + 2, f"{var}.append({item})")

    def read_union(
        self, branches: list[Any], var: str, ind: int, lifted_args: list[str] | None = None
    ) -> None:
        resolved = [self.resolve(b) for b in branches]
        kinds = [kind_of(b) for b in resolved]
        if lifted_args is None and len(branches) == 2 and "null" in kinds:
            self.read_optional(resolved, var, ind)
            return
        if all(k in ("record", "null") for k in kinds) and len(branches) < 64:
            self.read_record_union(resolved, var, ind, lifted_args or [])
            return
        if lifted_args:
            raise CodecError("a lifted union must hold records only")
        idx = self.tmp("u")
        self.read_primitive("long", idx, ind)
        for i, branch in enumerate(resolved):
            self.out.add(ind, f"{'if' if i == 0 else 'elif'} {idx} == {i}:")
            self.read_value(branch, var, ind + 1)
        self.out.add(ind, "else:")
        self.out.add(ind + 1, f"raise bad(f'union index {{{idx}}} out of range')")

    def read_optional(self, resolved: list[Any], var: str, ind: int) -> None:
        """``["null", X]`` (or ``[X, "null"]``): the index is one byte, 0x00 or 0x02."""
        null_idx = [kind_of(b) for b in resolved].index("null")
        other = resolved[1 - null_idx]
        tag = self.tmp("t")
        self.out.add(ind, f"{tag} = buf[pos]")
        self.out.add(ind, "pos += 1")
        self.out.add(ind, f"if {tag} == {2 * null_idx}:")
        self.out.add(ind + 1, f"{var} = None")
        self.out.add(ind, f"elif {tag} == {2 * (1 - null_idx)}:")
        self.read_value(other, var, ind + 1)
        self.out.add(ind, "else:")
        self.out.add(ind + 1, f"raise bad(f'union index byte {{{tag}:#x}} out of range')")

    def read_record_union(
        self, resolved: list[Any], var: str, ind: int, lifted_args: list[str]
    ) -> None:
        """A union of records dispatches through a table of record readers."""
        readers = []
        for branch in resolved:
            if kind_of(branch) == "null":
                readers.append(self.const(null_reader(len(lifted_args)), "N"))
            else:
                readers.append(f"r{self.record_id(branch['name'])}")
        idx = self.tmp("u")
        self.out.add(ind, f"{idx} = ZZ[buf[pos]]")
        self.out.add(ind, "pos += 1")
        self.dispatch_record_union(readers, idx, var, ind, lifted_args)

    def dispatch_record_union(
        self, readers: list[str], idx: str, var: str, ind: int, lifted_args: list[str]
    ) -> None:
        """Check the union index ``idx`` (already read) and call its branch's reader."""
        table = self.tmp("RT")
        self.read_tables.append((table, readers))
        self.out.add(ind, f"if {idx} is None or not 0 <= {idx} < {len(readers)}:")
        self.out.add(ind + 1, "raise bad(f'union index byte {buf[pos - 1]:#x} out of range')")
        extra = "".join(f", {a}" for a in lifted_args)
        self.out.add(ind, f"{var}, pos = {table}[{idx}](buf, pos{extra})")

    # writers ------------------------------------------------------------------------------

    def write_value(self, schema: Schema, var: str, ind: int) -> None:
        schema = self.resolve(schema)
        if isinstance(schema, list):
            self.write_union(schema, var, ind)
        elif isinstance(schema, str):
            self.write_primitive(schema, var, ind)
        else:
            self.write_complex(schema, var, ind)

    def write_primitive(self, kind: str, var: str, ind: int) -> None:
        add = self.out.add
        if kind == "null":
            add(ind, f"if {var} is not None:")
            add(ind + 1, f"raise TypeError('expected None, got ' + type({var}).__name__)")
        elif kind == "boolean":
            add(ind, f"out.append(1 if {var} else 0)")
        elif kind in ("int", "long"):
            add(ind, f"if 0 <= {var} < 64:")
            add(ind + 1, f"out.append({var} << 1)")
            add(ind, "else:")
            add(ind + 1, f"{'wint' if kind == 'int' else 'wlong'}(out, {var})")
        elif kind in ("float", "double"):
            add(ind, f"out += pack_{kind[0]}({var})")
        elif kind in ("bytes", "string"):
            self.write_bytes(var, ind, encode=kind == "string")
        else:
            raise CodecError(f"unsupported Avro type {kind!r}")

    def write_bytes(self, var: str, ind: int, encode: bool) -> None:
        add = self.out.add
        data = self.tmp("s")
        if encode:
            add(ind, f"{data} = {var}.encode()")
        else:
            add(ind, f"{data} = {var}")
        n = self.tmp("n")
        add(ind, f"{n} = len({data})")
        add(ind, f"if {n} < 64:")
        add(ind + 1, f"out.append({n} << 1)")
        add(ind, "else:")
        add(ind + 1, f"wlong(out, {n})")
        add(ind, f"out += {data}")

    def write_complex(self, schema: Mapping[str, Any], var: str, ind: int) -> None:
        kind = schema["type"]
        add = self.out.add
        if kind == "record" and self.inlinable(schema):
            self.write_fields(schema, record_binding(schema["name"]), var, ind)
        elif kind == "record":
            add(ind, f"w{self.record_id(schema['name'])}(out, {var})")
        elif kind == "enum":
            enum_cls = enum_binding(schema["name"])
            table = self.const({enum_cls(s): i for i, s in enumerate(schema["symbols"])}, "EI")
            idx = self.tmp("i")
            add(ind, f"{idx} = {table}[{var}]")
            self.write_primitive("int", idx, ind)
        elif kind == "fixed":
            add(ind, f"if len({var}) != {schema['size']}:")
            add(ind + 1, f"raise ValueError('fixed {schema['name']} needs {schema['size']} bytes')")
            add(ind, f"out += {var}")
        elif kind in ("array", "map"):
            self.write_blocks(schema, var, ind)
        else:
            raise CodecError(f"unsupported Avro type {kind!r}")

    def write_blocks(self, schema: Mapping[str, Any], var: str, ind: int) -> None:
        add = self.out.add
        item, key = self.tmp("it"), self.tmp("k")
        add(ind, f"if {var}:")
        add(ind + 1, f"wlong(out, len({var}))")
        if schema["type"] == "map":
            add(ind + 1, f"for {key}, {item} in {var}.items():")
            self.write_bytes(key, ind + 2, encode=True)
            self.write_value(schema["values"], item, ind + 2)
        else:
            add(ind + 1, f"for {item} in {var}:")
            self.write_value(schema["items"], item, ind + 2)
        add(ind, "out.append(0)")

    def write_union(self, branches: list[Any], var: str, ind: int) -> None:
        resolved = [self.resolve(b) for b in branches]
        kinds = [kind_of(b) for b in resolved]
        add = self.out.add
        if len(branches) == 2 and "null" in kinds:
            null_idx = kinds.index("null")
            add(ind, f"if {var} is None:")
            add(ind + 1, f"out.append({2 * null_idx})")
            add(ind, "else:")
            add(ind + 1, f"out.append({2 * (1 - null_idx)})")
            self.write_value(resolved[1 - null_idx], var, ind + 1)
        elif all(k in ("record", "null") for k in kinds) and len(branches) < 64:
            self.write_record_union(resolved, var, ind)
        else:
            self.write_general_union(resolved, var, ind)

    def write_record_union(self, resolved: list[Any], var: str, ind: int) -> None:
        """Dispatch on the exact class: ``{cls: (index byte, writer)}``."""
        entries: list[tuple[str, int, str]] = []
        for i, branch in enumerate(resolved):
            if kind_of(branch) == "null":
                entries.append(("NoneType", 2 * i, self.const(_noop_write, "W")))
            else:
                cls = record_binding(branch["name"]).cls
                if cls is None:
                    raise CodecError(f"record {branch['name']} cannot be a union branch")
                entries.append((self.const(cls, "C"), 2 * i, f"w{self.record_id(branch['name'])}"))
        table = self.tmp("WT")
        self.ns["NoneType"] = type(None)
        self.write_tables.append((table, entries))
        tag, fn = self.tmp("t"), self.tmp("f")
        self.out.add(ind, f"{tag}, {fn} = {table}[type({var})]")
        self.out.add(ind, f"out.append({tag})")
        self.out.add(ind, f"{fn}(out, {var})")

    def write_general_union(self, resolved: list[Any], var: str, ind: int) -> None:
        for i, branch in enumerate(resolved):
            test = self.branch_test(branch, var)
            self.out.add(ind, f"{'if' if i == 0 else 'elif'} {test}:")
            self.write_primitive("int", str(i), ind + 1)
            self.write_value(branch, var, ind + 1)
        self.out.add(ind, "else:")
        self.out.add(ind + 1, f"raise TypeError(type({var}).__name__ + ' fits no union branch')")

    def branch_test(self, branch: Schema, var: str) -> str:
        kind = kind_of(branch)
        tests = {
            "null": f"{var} is None",
            "boolean": f"isinstance({var}, bool)",
            "int": f"isinstance({var}, int) and not isinstance({var}, bool)",
            "float": f"isinstance({var}, float)",
            "bytes": f"isinstance({var}, (bytes, bytearray, memoryview))",
            "string": f"isinstance({var}, str)",
            "map": f"isinstance({var}, dict)",
            "array": f"isinstance({var}, (list, tuple))",
        }
        tests["long"], tests["double"], tests["fixed"] = (
            tests["int"],
            tests["float"],
            tests["bytes"],
        )
        if kind == "record":
            return f"type({var}) is {self.const(record_binding(branch['name']).cls, 'C')}"
        if kind == "enum":
            return f"isinstance({var}, {self.const(enum_binding(branch['name']), 'C')})"
        return tests[kind]


def kind_of(schema: Schema) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return str(schema["type"])
    return str(schema)


_TWINS: dict[type, type | None] = {}


def _twin(cls: type) -> type | None:
    """An unfrozen class with the slots and base of the slotted dataclass ``cls``, whose
    instances may become ``cls`` instances (None where the interpreter refuses that)."""
    if cls not in _TWINS:
        twin = type(
            f"_Unfrozen{cls.__name__}",
            cls.__bases__,
            {
                "__slots__": vars(cls)["__slots__"],
                "__setattr__": object.__setattr__,
                "__delattr__": object.__delattr__,
            },
        )
        probe: Any = object.__new__(twin)
        try:
            probe.__class__ = cls
            _TWINS[cls] = twin
        except TypeError:
            _TWINS[cls] = None
    return _TWINS[cls]


def null_reader(n_lifted: int) -> Callable[..., tuple[None, int]]:
    def read_null(buf: bytes, pos: int, *lifted: Any) -> tuple[None, int]:
        return None, pos

    return read_null


def compile_schema(schema: Mapping[str, Any]) -> Compiled:
    """Generate the reader and writer of a parsed top-level record schema."""
    return _Compiler(schema).run(schema)
