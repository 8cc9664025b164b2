"""What the payload codec chain costs: chain3 through activities carrying a 10 KB document,
with no codecs, with ``zstd``, and with ``zstd`` then ``aes-gcm``.

    .venv/bin/python benchmarks/payload_codecs.py [--bootstrap-servers HOST:PORT]
        [--n 300] [--rounds 2] [--size 10000] [--partitions 4]

Each round runs the three variants one after the other, in a new order each round, each
with a fresh processor and worker (``python -m engine run``, the chain from
``TURNSTILE_PAYLOAD_CODECS``) on fresh topics. Every payload passes the chain four times on
its way (the client or worker encodes, the processor decodes for the workflow and encodes
the next input, the worker decodes), so this is the chain's cost where it is paid most.
Per variant and round: a warm-up of 50 workflows, then N starts without waiting, one flush
and the wait for every completion (each result checked). Reported: workflows/s and the CPU
of processor and worker per workflow, medians over the rounds, and the throughput as a
ratio to no codecs. The rows go to ``benchmarks/results/payload-codecs.jsonl``.
"""

from __future__ import annotations

import argparse
import base64
import os
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import harness
import results_md
from codec_workload import document
from common import CpuSpan, emit, git_commit, host_info, machine_line, median, progress

from engine.client import Client
from engine.config.payloads import install_payload_codecs
from engine.config.settings import Settings
from engine.core.messages import InstanceStatus
from engine.services.client.workflow_client import InstanceState

#: Variant label -> the codec chain.
VARIANTS: dict[str, tuple[str, ...]] = {
    "none": (),
    "zstd": ("zstd",),
    "zstd, aes-gcm": ("zstd", "aes-gcm"),
}
KEYS = "bench:" + base64.b64encode(os.urandom(32)).decode()
MODULE = "benchmarks.codec_workload"


def throughput(client: Client, eng: harness.Engine, docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Start one workflow per document without waiting, flush, wait for every completion."""
    with CpuSpan({k: v for k, v in eng.pids.items() if k != "broker"}) as cpu:
        t0 = time.perf_counter()
        ids = [client.start("codecs.chain3", doc, flush=False) for doc in docs]
        client.flush()
        futures: list[Future[InstanceStatus]] = [client.completion_future(i) for i in ids]
        deadline = time.monotonic() + 600
        for instance_id, future in zip(ids, futures, strict=True):
            eng.check_alive()
            state = InstanceState(future.result(max(deadline - time.monotonic(), 0.001)))
            if state.output != 3:
                raise AssertionError(f"instance {instance_id} ended with {state.output!r}")
        total = time.perf_counter() - t0
    per = cpu.as_dict(per=len(docs))["cpu_ms_per_workflow"]
    return {"workflows_per_s": round(len(docs) / total, 2), "cpu_ms_per_wf": per}


def one_variant(args: argparse.Namespace, broker: harness.Broker, chain: tuple[str, ...]) -> Any:
    os.environ["TURNSTILE_PAYLOAD_CODECS"] = ",".join(chain)
    os.environ["TURNSTILE_PAYLOAD_KEYS"] = KEYS
    with harness.engine(broker, "codecs", MODULE, args.partitions, with_worker=True) as eng:
        settings = replace(eng.settings, payload_codecs=chain, payload_keys=KEYS)
        with Client(settings=settings) as client:
            throughput(client, eng, [document(args.size, i) for i in range(50)])
            docs = [document(args.size, 1000 + i) for i in range(args.n)]
            return throughput(client, eng, docs)


def measure(args: argparse.Namespace, broker: harness.Broker) -> dict[str, list[Any]]:
    runs: dict[str, list[Any]] = {v: [] for v in VARIANTS}
    names = list(VARIANTS)
    for round_ in range(args.rounds):
        shift = round_ % len(names)
        for variant in names[shift:] + names[:shift]:
            record = one_variant(args, broker, VARIANTS[variant])
            progress(f"round {round_}: {variant}: {record}")
            emit({"benchmark": "payload_codecs", "variant": variant, "round": round_, **record})
            runs[variant].append(record)
    install_payload_codecs(Settings())
    return runs


def rows(args: argparse.Namespace, runs: dict[str, list[Any]]) -> list[list[Any]]:
    host, commit = host_info(), git_commit()
    date = host["date_utc"].replace("T", " ").rstrip("Z")
    base = median(r["workflows_per_s"] for r in runs["none"])
    out = []
    for variant, records in runs.items():
        wfs = median(r["workflows_per_s"] for r in records)
        cpu = " / ".join(
            f"{median(r['cpu_ms_per_wf'].get(role, 0.0) for r in records):.2f}"
            for role in ("processor", "worker")
        )
        out.append(
            [date, commit, machine_line(host), args.rounds, variant,
             f"{args.size // 1000} KB, n={args.n}", f"{wfs:.1f}", cpu, f"{wfs / base:.2f}"]
        )  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="an existing broker (default: start one)")
    parser.add_argument("--n", type=int, default=300, help="workflows per measurement (300)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the 3 variants (2)")
    parser.add_argument("--size", type=int, default=10_000, help="document bytes (10000)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions (4)")
    parser.add_argument("--no-record", action="store_true", help="do not add the rows")
    args = parser.parse_args(argv)
    with harness.kafka(args.bootstrap_servers) as broker:
        runs = measure(args, broker)
    for cells in rows(args, runs):
        emit({"benchmark": "payload_codecs", "row": cells})
        if not args.no_record:
            results_md.append_record(results_md.make_record("payload-codecs", cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
