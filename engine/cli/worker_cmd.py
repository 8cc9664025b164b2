"""``run worker``: an activity worker process.

It imports the user's modules (so their ``@activity`` functions register), then consumes
activity tasks until SIGTERM or Ctrl-C, after which it stops taking tasks, lets running ones
finish (bounded by ``--shutdown-timeout``), commits and leaves its group.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import FrameType

from prometheus_client import CollectorRegistry

from engine.adapters.kafka.deadline import end_process_stuck
from engine.adapters.kafka.worker import KafkaWorker, run_loops
from engine.adapters.metrics import WorkerMetrics
from engine.cli import SubParsers
from engine.cli.gc_tuning import tune_gc
from engine.cli.observe import metrics_endpoint
from engine.cli.options import (
    add_log_level_argument,
    add_metrics_arguments,
    add_module_arguments,
    add_settings_arguments,
    configure_logging,
    connected_settings,
    require_registered,
)
from engine.cli.run_group import run_subparsers
from engine.cli.traces import process_tracing
from engine.core.errors import ConfigurationError
from engine.core.task_queues import check_task_queue
from engine.runtime.registry import default_registry
from engine.services.contracts import check_contracts
from engine.services.worker.queue_limits import QueueLimits
from engine.services.worker.runner import EXECUTORS

__all__ = ["STOP_GRACE_S", "import_modules", "register", "served_queues", "stop_on_signals"]

#: How long a process may take to stop after SIGTERM before it ends itself.
STOP_GRACE_S = 30.0

log = logging.getLogger(__name__)


def register(subparsers: SubParsers) -> None:
    """Add ``run worker``."""
    worker = run_subparsers(subparsers).add_parser(
        "worker",
        help="run an activity worker",
        description="Consume activity tasks, run the registered activities, produce their "
        "results. Scale by starting more workers with distinct --worker-id values.",
    )
    add_settings_arguments(worker)
    add_module_arguments(worker, "activities")
    worker.add_argument("--concurrency", type=int, help="activities running at once (default 16)")
    worker.add_argument(
        "--worker-id",
        help="stable, unique id of this worker; it names its static group membership and "
        "client id (default worker-0: give each worker its own)",
    )
    worker.add_argument(
        "--task-queue",
        action="append",
        dest="task_queues",
        metavar="QUEUE",
        help="consume this task queue (repeatable); default: the queues the registered "
        'activities name ("default" for those that name none)',
    )
    worker.add_argument(
        "--queue-rate",
        action="append",
        default=[],
        metavar="QUEUE=N",
        help="at most N activity starts per second on QUEUE across the whole fleet "
        "(split over the queue's partitions; give every worker of the queue the same value)",
    )
    worker.add_argument(
        "--queue-concurrency",
        action="append",
        default=[],
        metavar="QUEUE=K",
        help="at most K activities of QUEUE running at once across the whole fleet (split "
        "over its partitions, so K must be at least its partition count)",
    )
    worker.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="thread",
        help="where sync activities run: 'thread' (default; one past its start-to-close "
        "timeout is abandoned and its thread runs on) or 'process' (a child process per "
        "attempt, killed at its timeout; the activity must be a module-level function)",
    )
    worker.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds to let running activities finish when stopping (30)",
    )
    add_log_level_argument(worker)
    add_metrics_arguments(worker)
    worker.set_defaults(handler=_run_worker)


def _per_queue(values: list[str], flag: str, *, whole: bool = False) -> dict[str, float]:
    """``QUEUE=N`` flags as a mapping; a malformed one is a ConfigurationError."""
    out: dict[str, float] = {}
    for value in values:
        queue, sep, number = value.partition("=")
        try:
            limit = float(int(number)) if whole else float(number)
        except ValueError:
            limit = -1.0
        if not sep or limit <= 0:
            kind = "a whole number" if whole else "a number"
            raise ConfigurationError(
                f"{flag} {value!r}: write QUEUE=N with N {kind} above 0, e.g. {flag} gpu=5"
            )
        out[check_task_queue(queue)] = limit
    return out


def served_queues(flags: list[str] | None, registered: list[str]) -> list[str]:
    """The task queues a worker consumes, each once: those of ``--task-queue`` (repeatable),
    else those its registered activities name."""
    return list(dict.fromkeys(check_task_queue(q) for q in flags or registered))


def import_modules(names: Iterable[str]) -> list[str]:
    """Import the user's modules (from the current directory too, like ``python -m``)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    imported = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigurationError(
                f"cannot import module {name!r}: {exc}; check --module and that the module "
                f"is on PYTHONPATH (or run from the folder that contains it)"
            ) from exc
        imported.append(name)
    return imported


@contextmanager
def stop_on_signals(
    stop: threading.Event, grace_s: float = STOP_GRACE_S, *, logger: logging.Logger = log
) -> Iterator[None]:
    """Set ``stop`` on SIGTERM and SIGINT (a second signal exits at once), saying so on
    ``logger`` (the process's own: the worker's by default).

    A process that has not stopped ``grace_s`` seconds after the first signal ends itself
    with a log line (exit status 75): a stop must never hang, whatever a Kafka call or an
    activity does meanwhile.
    """

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        logger.info("received %s, stopping (at most %.0fs)", name, grace_s)
        stop.set()
        reason = f"still running {grace_s:.0f}s after {name}"
        watchdog = threading.Timer(grace_s, end_process_stuck, args=(reason,))
        watchdog.daemon = True  # a process that did stop in time exits without waiting for it
        watchdog.start()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_worker(args: argparse.Namespace) -> int:
    configure_logging(args)
    tune_gc()
    # bad limits are the user's to fix before anything connects
    rates = _per_queue(args.queue_rate, "--queue-rate")
    caps = _per_queue(args.queue_concurrency, "--queue-concurrency", whole=True)
    log.info("contracts: %s", check_contracts())
    settings = connected_settings(
        args, worker_concurrency=args.concurrency, worker_id=args.worker_id
    )
    import_modules([*settings.modules, *args.modules])
    names = sorted(a.name for a in default_registry.activities())
    require_registered(names, "activities")
    log.info("activities: %s", ", ".join(names))
    queues = served_queues(args.task_queues, default_registry.task_queues())
    log.info("task queues: %s", ", ".join(queues))
    metrics = WorkerMetrics(CollectorRegistry())
    workers = [
        KafkaWorker(
            settings,
            default_registry,
            shutdown_timeout_s=args.shutdown_timeout,
            metrics=metrics,
            task_queue=queue,
            executor=args.executor,
            queue_limits=QueueLimits(rates.get(queue, 0.0), int(caps.get(queue, 0))),
            tracing=process_tracing(),
        )
        for queue in queues
    ]
    stop = threading.Event()
    with (
        metrics_endpoint(args, metrics.registry, lambda: True),
        stop_on_signals(stop, STOP_GRACE_S + args.shutdown_timeout),
    ):
        run_loops(workers, stop)
    if any(w.worker.running for w in workers):
        # Threads running user code cannot be interrupted; do not hang the exit on them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
