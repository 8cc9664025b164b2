"""What metrics and traces cost on the broker: chain3.inline throughput of one processor
replica with no observability, with metrics, and with metrics and traces, from one run.

    .venv/bin/python benchmarks/observability_overhead.py [--bootstrap-servers HOST:PORT]
        [--n 1000] [--rounds 3] [--partitions 8]

Each round runs the three variants one after the other, in a new order each round, each as
a fresh processor subprocess (this file with ``--replica VARIANT``) on the same topics:

- ``none``: ``ProcessorRunner`` with ``NoMetrics`` and ``NoTracing``;
- ``metrics``: the Prometheus ``ProcessorMetrics`` hook (an unscraped registry);
- ``tracing``: metrics, plus the OpenTelemetry SDK with a ``BatchSpanProcessor`` around the
  SDK's ``InMemorySpanExporter`` (every run sampled: a span per run and per turn; no
  network);
- ``sampled``: the same with the SDK's ``ParentBased(TraceIdRatioBased(0.1))`` sampler,
  what ``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` with ``OTEL_TRACES_SAMPLER_ARG=0.1``
  gives (one run in ten traced).

Per variant and round: a warm-up of 200 workflows (which also waits for the replica's
assignment and restore), then N starts without waiting, one flush, and the wait for every
completion (each result checked). Reported: workflows/s and the replica's CPU per workflow,
the medians over the rounds, and each as a ratio to ``none`` (the overhead).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import harness
from common import (
    REPO,
    CpuSpan,
    emit,
    git_commit,
    host_info,
    machine_line,
    median,
    progress,
)

from engine.client import Client
from engine.core.messages import InstanceStatus
from engine.services.client.workflow_client import InstanceState

VARIANTS = ("none", "metrics", "tracing", "sampled")
#: The share of runs the ``sampled`` variant traces.
SAMPLED_RATIO = 0.1
WORKFLOW = "chain3.inline"
STEPS = 3


# --- the replica subprocess ------------------------------------------------------------------


def run_replica(args: argparse.Namespace) -> int:
    """One processor replica observed as ``args.replica`` says, until SIGTERM."""
    import engine.examples.chain3  # noqa: F401  (registers chain3.inline)
    from engine.adapters.kafka.processor import ProcessorRunner
    from engine.config.settings import load_settings
    from engine.runtime.registry import default_registry

    settings = load_settings(
        env={},
        bootstrap_servers=args.bootstrap_servers,
        namespace=args.namespace,
        partitions=args.partitions,
        state_dir=args.state_dir,
        replica_id=f"bench-{args.replica}",
    )
    metrics, tracing, exporter = _observers(args.replica)
    hook = tracing.hook if tracing is not None else None
    runner = ProcessorRunner(settings, default_registry, metrics=metrics, tracing=hook)
    if metrics is not None:
        metrics.watch(runner)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    runner.run(stop)
    if exporter is not None:
        tracing.shutdown()  # flushes the batch processor
        progress(f"replica {args.replica}: {len(exporter.get_finished_spans())} spans exported")
    return 0


def _observers(variant: str) -> tuple[Any, Any, Any]:
    if variant == "none":
        return None, None, None
    from prometheus_client import CollectorRegistry

    from engine.adapters.metrics import ProcessorMetrics

    metrics = ProcessorMetrics(CollectorRegistry())
    if variant == "metrics":
        return metrics, None, None
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from engine.adapters.tracing import tracing_with

    sampler = None
    if variant == "sampled":
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        sampler = ParentBased(TraceIdRatioBased(SAMPLED_RATIO))
    exporter = InMemorySpanExporter()
    tracing = tracing_with(BatchSpanProcessor(exporter), sampler=sampler)
    return metrics, tracing, exporter


# --- the driver ------------------------------------------------------------------------------


class Replica:
    """A replica subprocess of one variant, logging to a file."""

    def __init__(self, variant: str, bootstrap: str, namespace: str, partitions: int, work: Path):
        self.variant = variant
        self.log_path = work / f"replica-{variant}-{time.time_ns()}.log"
        self._log = self.log_path.open("wb")
        command = [
            sys.executable, __file__, "--replica", variant,
            "--bootstrap-servers", bootstrap, "--namespace", namespace,
            "--partitions", str(partitions),
            "--state-dir", tempfile.mkdtemp(prefix=f"state-{variant}-", dir=work),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.popen = subprocess.Popen(
            command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise RuntimeError(f"the {self.variant} replica exited; see {self.log_path}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(60)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._log.close()


def throughput(client: Client, replica: Replica, n: int, first: int) -> dict[str, Any]:
    """N starts without waiting, one flush, then every completion (results checked)."""
    with CpuSpan({"processor": replica.popen.pid}) as cpu:
        t0 = time.perf_counter()
        ids = [client.start(WORKFLOW, first + i, flush=False) for i in range(n)]
        client.flush()
        futures: list[Future[InstanceStatus]] = [client.completion_future(i) for i in ids]
        deadline = time.monotonic() + 600
        for i, future in enumerate(futures):
            replica.check_alive()
            state = InstanceState(future.result(max(deadline - time.monotonic(), 0.001)))
            if state.output != first + i + STEPS:
                raise AssertionError(f"instance {ids[i]} ended with {state.output!r}")
        total = time.perf_counter() - t0
    per = cpu.as_dict(per=n)
    return {
        "workflows_per_s": round(n / total, 2),
        "processor_cpu_ms_per_wf": per["cpu_ms_per_workflow"]["processor"],
    }


def measure(args: argparse.Namespace, bootstrap: str) -> dict[str, list[dict[str, Any]]]:
    namespace = harness.fresh_namespace("observe")
    settings = harness.create_topics(bootstrap, namespace, args.partitions)
    work = Path(tempfile.mkdtemp(prefix="turnstile-observe-"))
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    next_input = 0
    with Client(settings=settings) as client:
        for round_ in range(args.rounds):
            shift = round_ % len(VARIANTS)
            order = VARIANTS[shift:] + VARIANTS[:shift]
            for variant in order:
                replica = Replica(variant, bootstrap, namespace, args.partitions, work)
                try:
                    progress(f"round {round_}: {variant}: warm-up 200")
                    throughput(client, replica, 200, next_input)
                    next_input += 200
                    record = throughput(client, replica, args.n, next_input)
                    next_input += args.n
                finally:
                    replica.stop()
                progress(f"round {round_}: {variant}: {record}")
                emit({"benchmark": "observability_overhead", "variant": variant,
                      "round": round_, **record})  # fmt: skip
                runs[variant].append(record)
    shutil.rmtree(work, ignore_errors=True)
    return runs


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    med = {
        v: {
            k: round(median(r[k] for r in rs), 3)
            for k in ("workflows_per_s", "processor_cpu_ms_per_wf")
        }
        for v, rs in runs.items()
    }
    base = med["none"]
    for values in med.values():
        values["throughput_vs_none"] = round(values["workflows_per_s"] / base["workflows_per_s"], 3)
        values["cpu_vs_none"] = round(
            values["processor_cpu_ms_per_wf"] / base["processor_cpu_ms_per_wf"], 3
        )
    return med


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="an existing broker (default: start one)")
    parser.add_argument("--n", type=int, default=1000, help="workflows per measurement (1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the 4 variants (3)")
    parser.add_argument("--partitions", type=int, default=8, help="partitions (8)")
    parser.add_argument("--replica", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.replica:
        return run_replica(args)
    host, commit = host_info(), git_commit()
    with harness.kafka(args.bootstrap_servers) as broker:
        runs = measure(args, broker.bootstrap)
    med = summarize(runs)
    emit({"benchmark": "observability_overhead", "kind": "summary", "commit": commit,
          "machine": machine_line(host), "date_utc": host["date_utc"], "n": args.n,
          "rounds": args.rounds, "partitions": args.partitions, "median": med})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
