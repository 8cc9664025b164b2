"""``demo``: the whole engine, end to end, on a real Kafka, in one command.

It starts the local broker (unless ``$ENGINE_BOOTSTRAP_SERVERS`` names one), creates the
topics, runs a processor replica and an activity worker in this process, and walks two
orders through ``engine.examples.orders``: one approved (charged, approved by an event
raised through the client, shipped by a child workflow) and one whose approval never comes
(the deadline passes and the charge is refunded). It prints each outcome and the first
order's timeline as read back from the history topic.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from engine.adapters.kafka.config import BOOTSTRAP_ENV
from engine.cli import SubParsers
from engine.cli.options import add_metrics_arguments
from engine.config.payloads import install_payload_codecs
from engine.config.settings import Settings, load_settings
from engine.dev.local_kafka import LocalKafka


def register(subparsers: SubParsers) -> None:
    """Add the ``demo`` command."""
    demo = subparsers.add_parser(
        "demo",
        help=f"run a sample order workflow end to end (starts a local Kafka unless "
        f"{BOOTSTRAP_ENV} is set)",
        description="Start Kafka (if needed), create the topics, run a processor and a "
        "worker, run two orders (one approved, one timing out and refunded), print the "
        "outcomes and a timeline.",
    )
    demo.add_argument(
        "--keep-broker", action="store_true", help="leave a broker started by the demo running"
    )
    demo.add_argument("--timeout", type=float, default=120.0, help="seconds per order (120)")
    add_metrics_arguments(demo)
    demo.add_argument(
        "--linger",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --metrics-port, keep serving the metrics this long after the orders end",
    )
    demo.set_defaults(handler=_run)


def _say(message: str) -> None:
    print(message, flush=True)


@contextmanager
def _broker(keep: bool) -> Iterator[str]:
    bootstrap = os.environ.get(BOOTSTRAP_ENV)
    if bootstrap:
        yield bootstrap
        return
    broker = LocalKafka()
    was_running = broker.status().running
    bootstrap = broker.start()
    try:
        yield bootstrap
    finally:
        if not was_running and not keep:
            _say("stopping the local Kafka broker")
            broker.stop()


@contextmanager
def _engine(settings: Settings, args: argparse.Namespace) -> Iterator[None]:
    """A processor replica and a worker on threads of this process, with their metrics on
    ``--metrics-port`` if given."""
    from prometheus_client import CollectorRegistry

    from engine.adapters.kafka.worker import KafkaWorker
    from engine.adapters.metrics import WorkerMetrics
    from engine.cli.observe import metrics_endpoint, observed_processor
    from engine.cli.traces import process_tracing
    from engine.runtime.registry import default_registry

    stop = threading.Event()
    registry = CollectorRegistry()
    runner, metrics = observed_processor(settings, registry, args)
    worker = KafkaWorker(
        settings, default_registry, metrics=WorkerMetrics(registry), tracing=process_tracing()
    )
    threads = [
        threading.Thread(target=runner.run, args=(stop,), name="processor", daemon=True),
        threading.Thread(target=worker.run, args=(stop,), name="worker", daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        with metrics_endpoint(args, registry, lambda: metrics.ready) as server:
            if server is not None:
                _say(f"metrics on {server.url}/metrics")
            yield
            if server is not None and args.linger > 0:
                _say(f"serving metrics for {args.linger:.0f}s more (Ctrl-C ends)")
                stop.wait(args.linger)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)


def _run(args: argparse.Namespace) -> int:
    import engine.examples.orders  # noqa: F401 - registers the order workflows
    from engine.adapters.kafka.admin import apply, ensure_reachable
    from engine.config.topics import load_spec

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with _broker(args.keep_broker) as bootstrap, tempfile.TemporaryDirectory() as state:
        settings = load_settings(
            bootstrap_servers=bootstrap, namespace="demo", partitions=8, state_dir=state
        )
        install_payload_codecs(settings)  # before the in-process engine makes a payload
        ensure_reachable(settings, settings.connect_timeout_s)
        _say(f"Kafka at {bootstrap}; creating the demo topics (namespace 'demo')")
        apply(load_spec(), settings)
        with _engine(settings, args):
            _say("processor and worker running")
            ok = _orders(settings, args.timeout)
    return 0 if ok else 1


def _orders(settings: Settings, timeout: float) -> bool:
    from engine.client import Client

    run = uuid.uuid4().hex[:6]
    with Client(settings=settings) as client:
        approved = client.start(
            "orders.order", {"order_id": f"A-{run}", "amount": 42}, instance_id=f"order-A-{run}"
        )
        _say(f"started {approved}; waiting until it asks for approval")
        _wait_custom_status(client, approved, "awaiting approval", timeout)
        client.raise_event(approved, "approval", {"approved": True, "by": "demo"})
        _say(f"raised 'approval' on {approved}")
        late = client.start(
            "orders.order",
            {"order_id": f"B-{run}", "amount": 7, "approval_timeout_s": 2},
            instance_id=f"order-B-{run}",
        )
        _say(f"started {late}; nobody approves it, its 2 s deadline will pass")
        first = client.wait_for_completion(approved, timeout=timeout)
        second = client.wait_for_completion(late, timeout=timeout)
    _say(f"\n{approved}: {first.status.value} -> {first.output}")
    _say(f"{late}: {second.status.value} -> {second.output}")
    _timeline(settings, approved)
    return bool(
        first.output
        and first.output.get("status") == "shipped"
        and second.output
        and second.output.get("status") == "refunded"
    )


def _wait_custom_status(client: Any, instance_id: str, wanted: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = client.get(instance_id)
        if state is not None and state.custom_status == wanted:
            return
        time.sleep(0.05)
    print(f"warning: {instance_id} did not reach {wanted!r} in time", file=sys.stderr)


def _timeline(settings: Settings, instance_id: str) -> None:
    from engine.adapters.kafka.history import read_instance_history
    from engine.services.audit.timeline import HEADER, timeline_lines

    events = read_instance_history(settings, instance_id)
    _say(f"\nTimeline of {instance_id} (from the history topic, {len(events)} events):")
    _say(HEADER)
    for line in timeline_lines(events, width=70):
        _say(line)
