"""Encode and decode throughput of the wire codec, per record type.

Prints one JSON line per measurement (machine-readable) and a summary table at the end.
For comparison it also measures the reference path (fastavro's schemaless writer/reader
plus dict <-> dataclass conversion) on two representative records.

    .venv/bin/python benchmarks/codec_bench.py            # every record type
    .venv/bin/python benchmarks/codec_bench.py --quick    # shorter runs
    .venv/bin/python benchmarks/codec_bench.py --only TaskCompleted StartWorkflow
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import fastavro

from engine import codec
from engine.codec.bindings import from_avro, to_avro
from engine.core.failure import FailureDetails
from engine.core.history import (
    ChildWorkflowCompleted,
    ChildWorkflowCreated,
    ChildWorkflowFailed,
    ContinuedAsNew,
    CustomStatusSet,
    EventBody,
    EventRaised,
    EventSent,
    ExecutionCompleted,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionSuspended,
    ExecutionTerminated,
    HistoryEvent,
    InlineStepCompleted,
    InlineStepFailed,
    RuntimeStatus,
    TaskCompleted,
    TaskFailed,
    TaskScheduled,
    TimerCancelled,
    TimerCreated,
    TimerFired,
    TurnStarted,
)
from engine.core.messages import (
    ActivityResult,
    ActivityTask,
    ChildResult,
    DeadLetter,
    InstanceStatus,
    Message,
    PurgeWorkflow,
    RaiseEvent,
    ResumeWorkflow,
    StartWorkflow,
    SuspendWorkflow,
    TerminateWorkflow,
)
from engine.core.payloads import Payload

NOW = 1_732_900_000_000
IID = "order-000123"
INPUT = Payload(b'{"customer":"c-981","amount":42.5,"currency":"EUR"}')
OUTPUT = Payload(b'{"ok":true,"receipt":"r-77120"}')
FAILURE = FailureDetails("PaymentDeclined", "card declined", "Traceback (most recent call...)")

BODIES: list[EventBody] = [
    ExecutionStarted("checkout", INPUT, "v3", tags={"team": "payments"}, request_id="req-1"),
    ExecutionCompleted(RuntimeStatus.COMPLETED, OUTPUT),
    ExecutionTerminated("operator request"),
    ExecutionSuspended("maintenance"),
    ExecutionResumed("maintenance over"),
    ContinuedAsNew(INPUT, 1),
    TaskScheduled(3, "charge_card", INPUT, 1, 30_000),
    TaskCompleted(3, OUTPUT, 1),
    TaskFailed(3, FAILURE, 2),
    InlineStepCompleted(4, "pick_warehouse", OUTPUT),
    InlineStepFailed(4, "pick_warehouse", FAILURE),
    ChildWorkflowCreated(5, "ship", "order-000123:ship", INPUT, "v1"),
    ChildWorkflowCompleted(5, OUTPUT),
    ChildWorkflowFailed(5, FAILURE),
    TimerCreated(6, NOW + 60_000),
    TimerFired(6, NOW + 60_000),
    TimerCancelled(6),
    EventRaised("approved", INPUT),
    EventSent(7, "order-000124", "ready", INPUT),
    CustomStatusSet(Payload(b'{"stage":"charging"}')),
    TurnStarted(NOW),
]

MESSAGES: list[Message] = [
    StartWorkflow(IID, "checkout", INPUT, "v3", request_id="req-1", tags={"team": "payments"}),
    RaiseEvent(IID, "approved", INPUT, "req-2"),
    TerminateWorkflow(IID, "operator request", True),
    SuspendWorkflow(IID, "maintenance"),
    ResumeWorkflow(IID, "maintenance over"),
    PurgeWorkflow(IID),
    ChildResult(IID, 0, 5, "order-000123:ship", RuntimeStatus.COMPLETED, OUTPUT),
    ActivityTask(IID, 0, 3, 1, "charge_card", INPUT, 30_000, NOW),
    ActivityResult(IID, 0, 3, 1, OUTPUT),
    InstanceStatus(IID, "checkout", "v3", RuntimeStatus.RUNNING, 0, NOW, NOW, INPUT),
    DeadLetter(IID, "unknown schema", "turnstile.commands", 7, 1234, IID.encode(), b"junk", NOW),
]


CLOCK: Callable[[], float] = time.perf_counter


def measure(fn: Callable[[], Any], seconds: float) -> float:
    """Best seconds per call over five runs of about ``seconds`` each (the minimum is the
    least disturbed by other processes)."""
    calls = 1
    while True:
        start = CLOCK()
        for _ in range(calls):
            fn()
        elapsed = CLOCK() - start
        if elapsed > seconds / 10:
            break
        calls *= 4
    calls = max(1, int(calls * seconds / elapsed))
    best = float("inf")
    for _ in range(5):
        start = CLOCK()
        for _ in range(calls):
            fn()
        best = min(best, (CLOCK() - start) / calls)
    return best


def _emit(
    results: list[dict[str, Any]], record: str, op: str, path: str, per_call: float, size: int
) -> None:
    result = {
        "bench": "codec",
        "record": record,
        "op": op,
        "path": path,
        "us_per_record": round(per_call * 1e6, 3),
        "records_per_s": round(1 / per_call),
        "bytes": size,
    }
    results.append(result)
    print(json.dumps(result), flush=True)


def bench_fast(name: str, obj: Any, seconds: float, results: list[dict[str, Any]]) -> None:
    if isinstance(obj, HistoryEvent):
        encode: Callable[[Any], bytes] = codec.encode_history
        decode: Callable[[bytes], Any] = codec.decode_history
    else:
        encode, decode = codec.encode_message, codec.decode_message
    data = encode(obj)
    assert decode(data) == obj
    _emit(results, name, "encode", "compiled", measure(lambda: encode(obj), seconds), len(data))
    _emit(results, name, "decode", "compiled", measure(lambda: decode(data), seconds), len(data))


def bench_reference(name: str, obj: Any, seconds: float, results: list[dict[str, Any]]) -> None:
    """fastavro schemaless writer/reader on parsed schemas, plus dataclass conversion."""
    schema_name = "HistoryEvent" if isinstance(obj, HistoryEvent) else "Command"
    schema = codec.current_schema(schema_name)
    parsed, named, header = schema.parsed, schema.parsed["__named_schemas"], schema.header

    def encode() -> bytes:
        out = io.BytesIO()
        out.write(header)
        fastavro.schemaless_writer(out, parsed, to_avro(obj, parsed, named))
        return out.getvalue()

    data = encode()

    def decode() -> Any:
        stream = io.BytesIO(data)
        stream.seek(10)
        datum = fastavro.schemaless_reader(
            stream, parsed, None, return_record_name=True, return_record_name_override=True
        )
        return from_avro(datum, parsed, named)

    assert decode() == obj
    _emit(results, name, "encode", "fastavro", measure(encode, seconds), len(data))
    _emit(results, name, "decode", "fastavro", measure(decode, seconds), len(data))


def bench_seal(seconds: float, results: list[dict[str, Any]]) -> None:
    event = HistoryEvent(IID, 42, NOW, 0, TaskCompleted(3, OUTPUT, 1))
    _, data = codec.seal_history(event, b"\x01" * 32)
    _emit(
        results,
        "TaskCompleted",
        "seal",
        "compiled",
        measure(lambda: codec.seal_history(event, b"\x01" * 32), seconds),
        len(data),
    )
    _emit(
        results,
        "TaskCompleted",
        "hash_ok",
        "compiled",
        measure(lambda: codec.history_hash_ok(data), seconds),
        len(data),
    )


def summary(results: list[dict[str, Any]]) -> str:
    rows: dict[tuple[str, str], dict[str, float]] = {}
    for r in results:
        rows.setdefault((r["record"], r["path"]), {})[r["op"]] = r["us_per_record"]
    lines = [f"{'record':<24} {'path':<9} {'encode µs':>10} {'decode µs':>10} {'decode/s':>10}"]
    for (record, path), ops in rows.items():
        enc, dec = ops.get("encode"), ops.get("decode")
        if enc is None or dec is None:
            extra = ", ".join(f"{op} {us:.2f} µs" for op, us in ops.items())
            lines.append(f"{record:<24} {path:<9} {extra}")
            continue
        lines.append(f"{record:<24} {path:<9} {enc:>10.2f} {dec:>10.2f} {1e6 / dec:>10,.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="0.05 s per measurement")
    parser.add_argument("--seconds", type=float, default=0.3, help="time per measurement")
    parser.add_argument("--only", nargs="*", help="record type names to measure")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="measure process CPU time instead of wall time (steadier on a busy machine)",
    )
    args = parser.parse_args(argv)
    if args.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    seconds = 0.05 if args.quick else args.seconds
    samples: dict[str, Any] = {type(b).__name__: HistoryEvent(IID, 42, NOW, 0, b) for b in BODIES}
    samples.update({type(m).__name__: m for m in MESSAGES})
    chosen = {k: v for k, v in samples.items() if not args.only or k in args.only}
    print(f"# python {platform.python_version()} on {platform.machine()}", file=sys.stderr)
    results: list[dict[str, Any]] = []
    for name, obj in chosen.items():
        bench_fast(name, obj, seconds, results)
    for name in ("TaskCompleted", "StartWorkflow"):
        if name in chosen:
            bench_reference(name, chosen[name], seconds, results)
    bench_seal(seconds, results)
    print(summary(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
