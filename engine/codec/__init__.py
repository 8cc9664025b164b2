"""Wire contracts: Avro single-object encoding of every record the engine writes or reads.

This package is the only place that knows Avro (and the only importer of fastavro). Every
record starts with ``C3 01`` and the CRC-64-AVRO fingerprint of its writer schema, so a
reader always knows which schema wrote it; records of released older schemas are resolved
against the current ones. See ``schemas/README.md`` for the contract and evolution rules.
With a Schema Registry, records may also carry the registry's framing (magic byte and
schema id, ``engine.codec.confluent``); decoding accepts both.
"""

from engine.codec.container import history_schema, read_history_file, write_history_file
from engine.codec.registry import HEADER_SIZE, MARKER, WriterSchema, schema_fingerprint
from engine.codec.user_avro import decode_user_avro, encode_user_avro, parse_user_schema
from engine.codec.wire import (
    HASH_SIZE,
    SchemaInfo,
    current_schema,
    decode_histories,
    decode_history,
    decode_message,
    decode_row,
    encode_history,
    encode_message,
    encode_row,
    hash_of,
    history_hash_ok,
    known_schemas,
    previous_hash_of,
    reload_schemas,
    seal_history,
    verify_history_chain,
)
from engine.core.keys import instance_key

__all__ = [
    "HASH_SIZE",
    "HEADER_SIZE",
    "MARKER",
    "SchemaInfo",
    "WriterSchema",
    "current_schema",
    "decode_histories",
    "decode_history",
    "decode_message",
    "decode_row",
    "decode_user_avro",
    "encode_history",
    "encode_message",
    "encode_row",
    "encode_user_avro",
    "hash_of",
    "history_hash_ok",
    "history_schema",
    "instance_key",
    "known_schemas",
    "parse_user_schema",
    "previous_hash_of",
    "read_history_file",
    "reload_schemas",
    "schema_fingerprint",
    "seal_history",
    "verify_history_chain",
    "write_history_file",
]
