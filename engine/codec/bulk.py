"""Generated decoding of many records in one loop: a cold load's history at a fraction of
the per-record cost of one decode call per row.

Why: replay targets 300k events/s per core including decoding. A single decode costs
several Python calls per record (the codec entry, the record reader, the body reader,
their result tuples); this loop reads the envelope and the most frequent bodies inline and
builds the objects the same way as the single-record readers (``engine.codec.compiler``),
so both paths give the same values. Rows it does not read itself go to the single decoder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from engine.codec.bindings import check_record_fields, record_binding, short_name
from engine.codec.compiler import READ_ERRORS, _Compiler, kind_of, null_reader
from engine.core.errors import CodecError

ManyReader = Callable[[Iterable[bytes], Callable[[bytes], Any]], list[Any]]


class _BulkCompiler(_Compiler):
    """The record readers of a schema plus ``rmany``, the loop over many records."""

    def run_bulk(self, root: Mapping[str, Any], header: bytes, hot: tuple[str, ...]) -> Any:
        """One function decoding a list of records: the root record and the ``hot`` branches
        of its record union are read inline in the loop, so a record costs no calls at all
        unless a field needs a long varint or a cold branch. Rows that do not start with
        ``header`` (older schemas, other framings), and rows that fail, go to ``one``, which
        decodes or explains them exactly as a single decode does."""
        binding = record_binding(root["name"])
        if binding.cls is None or binding.lifted:
            raise CodecError(f"{root['name']} is not a plain record; it cannot be read in bulk")
        check_record_fields(root["name"], root)
        self.named.setdefault(root["name"], root)
        self.ns.update(HEADER=header, HSIZE=len(header), ERRORS=READ_ERRORS)
        add = self.out.add
        add(0, "def rmany(rows, one):")
        add(1, "out = []")
        add(1, "add = out.append")
        add(1, "for buf in rows:")
        add(2, "if buf.__class__ is not bytes or buf[:HSIZE] != HEADER:")
        add(3, "add(one(buf))")
        add(3, "continue")
        add(2, "try:")
        add(3, f"pos = {len(header)}")
        self.wide_varints = 6  # a millisecond timestamp takes six
        values = []
        for f in root["fields"]:
            var = self.tmp("v")
            resolved = self.resolve(f["type"])
            if isinstance(resolved, list) and all(
                kind_of(self.resolve(b)) in ("record", "null") for b in resolved
            ):
                self.read_hot_union([self.resolve(b) for b in resolved], var, 3, hot)
            else:
                self.read_value(f["type"], var, 3)
            values.append((f["name"], var))
        self.wide_varints = 2
        add(3, "if pos == len(buf):")
        self.construct(binding, values, "o", 4)
        add(4, "add(o)")
        add(4, "continue")
        add(2, "except ERRORS:")
        add(3, "pass")
        add(2, "add(one(buf))")
        add(1, "return out")
        add(0, "")
        while self.pending:
            name = self.pending.pop()
            self.emit_record(name, self.named[name])
        source = "\n".join(self.out.rows) + "\n"
        exec(compile(source, f"<avro bulk codec {root['name']}>", "exec"), self.ns)
        self.link_tables()
        return self.ns["rmany"]

    def read_hot_union(self, resolved: list[Any], var: str, ind: int, hot: tuple[str, ...]) -> None:
        """A record union whose ``hot`` branches are read inline (most frequent first), the
        others through the dispatch table."""
        names = [short_name(b["name"]) if kind_of(b) == "record" else "" for b in resolved]
        idx = self.tmp("u")
        self.out.add(ind, f"{idx} = ZZ[buf[pos]]")
        self.out.add(ind, "pos += 1")
        keyword = "if"
        for name in hot:
            if name not in names:
                continue
            branch = resolved[names.index(name)]
            self.out.add(ind, f"{keyword} {idx} == {names.index(name)}:")
            self.read_record_inline(branch, var, ind + 1)
            keyword = "elif"
        readers = [
            f"r{self.record_id(b['name'])}"
            if kind_of(b) == "record"
            else self.const(null_reader(0), "N")
            for b in resolved
        ]
        if keyword == "if":
            self.dispatch_record_union(readers, idx, var, ind, [])
            return
        self.out.add(ind, "else:")
        self.dispatch_record_union(readers, idx, var, ind + 1, [])

    def read_record_inline(self, schema: Mapping[str, Any], var: str, ind: int) -> None:
        binding = record_binding(schema["name"])
        if binding.cls is None or binding.lifted:
            raise CodecError(f"{schema['name']} is not a plain record; it cannot be inlined")
        check_record_fields(schema["name"], schema)
        values = []
        for f in schema["fields"]:
            fvar = self.tmp("v")
            self.read_value(f["type"], fvar, ind)
            values.append((f["name"], fvar))
        self.construct(binding, values, var, ind)


def compile_many_reader(
    schema: Mapping[str, Any], header: bytes, hot: tuple[str, ...] = ()
) -> ManyReader:
    """Generate ``read_many(rows, one)``: the records of ``rows`` decoded in one loop.

    Rows that start with ``header`` are read inline; the others, and any row the inline
    code cannot read to its exact end, are handed to ``one`` (the single-record decoder),
    so the result and every error are those of ``[one(row) for row in rows]``. ``hot``
    names the branches of the root's record union to read inline, most frequent first.
    """
    reader: ManyReader = _BulkCompiler(schema).run_bulk(schema, header, hot)
    return reader
