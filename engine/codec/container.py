"""Avro object container files of history, for auditors and analytics tools.

Container files carry their schema in the header, so Spark, DuckDB, Avro tools and any
other reader can open an export without the engine. The exported schema keeps its
``timestamp-millis`` annotations so such tools see timestamps, not bare numbers.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import IO, Any

from fastavro import reader, writer

from engine.codec.bindings import from_avro, to_avro
from engine.codec.registry import HISTORY, parse_record
from engine.codec.wire import current_schema
from engine.core.history import HistoryEvent


def history_schema() -> dict[str, Any]:
    """The current HistoryEvent schema, parsed by fastavro, logical types included.

    A fresh copy on every call: change it freely.
    """
    return parse_record(copy.deepcopy(current_schema(HISTORY).raw))


def write_history_file(
    fo: IO[bytes], events: Iterable[HistoryEvent], codec: str = "deflate"
) -> int:
    """Write events to an Avro object container file; returns how many were written."""
    schema = history_schema()
    named = schema["__named_schemas"]
    written = 0

    def records() -> Iterator[dict[str, Any]]:
        nonlocal written
        for event in events:
            written += 1
            datum: dict[str, Any] = to_avro(event, schema, named)
            yield datum

    writer(fo, schema, records(), codec=codec)
    return written


def read_history_file(fo: IO[bytes]) -> Iterator[HistoryEvent]:
    """Read events back from a container file written with any known history schema."""
    schema = history_schema()
    named = schema["__named_schemas"]
    records = reader(
        fo, reader_schema=schema, return_record_name=True, return_record_name_override=True
    )
    for datum in records:
        event: HistoryEvent = from_avro(datum, schema, named)
        yield event
