"""``demo``: show that the Kafka in use honours transactions (a placeholder for the full
workflow demo).

It uses ``$ENGINE_BOOTSTRAP_SERVERS`` when set; otherwise it starts the local broker, runs
the checks and stops the broker again if it started it.
"""

from __future__ import annotations

import argparse
import os
import sys

from engine.adapters.kafka_config import BOOTSTRAP_ENV
from engine.adapters.local_kafka import LocalKafka
from engine.cli import SubParsers


def register(subparsers: SubParsers) -> None:
    """Add the ``demo`` command."""
    demo = subparsers.add_parser(
        "demo",
        help=f"run the demo against Kafka (starts a local broker unless {BOOTSTRAP_ENV} is set)",
    )
    demo.add_argument(
        "--keep-broker", action="store_true", help="leave a broker started by the demo running"
    )
    demo.add_argument("--timeout", type=float, default=30.0, help="seconds per check (30)")
    demo.set_defaults(handler=_run)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace) -> int:
    # Imported here so that the rest of the CLI starts without loading the Kafka client.
    from engine.adapters.conformance import run_conformance

    bootstrap = os.environ.get(BOOTSTRAP_ENV)
    broker: LocalKafka | None = None
    if not bootstrap:
        broker = LocalKafka()
        was_running = broker.status().running
        bootstrap = broker.start()
        if was_running or args.keep_broker:
            broker = None  # not ours to stop
    try:
        print(f"Kafka at {bootstrap}: checking what exactly-once processing relies on")
        results = run_conformance(bootstrap, timeout=args.timeout, progress=_progress)
    finally:
        if broker is not None:
            broker.stop()
    for result in results:
        print(f"  [{'ok' if result.passed else 'FAILED'}] {result.name}: {result.detail}")
    failed = [r for r in results if not r.passed]
    print("all checks passed" if not failed else f"{len(failed)} check(s) failed")
    return 0 if not failed else 1
