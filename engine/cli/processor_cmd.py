"""``run processor`` and ``run all``: a processor replica, or a replica plus a worker.

A replica's ``--replica-id`` must be stable across its restarts (it names the transactional
id that fences a crashed predecessor) and unique among running replicas.
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry

from engine.adapters.kafka import admin as kafka_admin
from engine.adapters.kafka.processor import ProcessorRunner
from engine.adapters.kafka.worker import KafkaWorker
from engine.adapters.metrics import WorkerMetrics
from engine.adapters.schema_registry import connect_schema_registry
from engine.cli import SubParsers
from engine.cli.gc_tuning import tune_gc
from engine.cli.integration import (
    check_integration_topics,
    trigger_bridge,
    with_integration_flags,
)
from engine.cli.observe import metrics_endpoint, observed_processor
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
from engine.cli.worker_cmd import STOP_GRACE_S, import_modules, stop_on_signals
from engine.config.settings import Settings
from engine.config.topics import load_spec
from engine.runtime.registry import default_registry
from engine.services.contracts import check_contracts

__all__ = ["register"]

log = logging.getLogger("engine.processor")


def register(subparsers: SubParsers) -> None:
    """Add ``run processor`` and ``run all``."""
    group = run_subparsers(subparsers)
    processor = group.add_parser(
        "processor",
        help="run a processor replica",
        description="Own a share of the partitions, run workflow turns exactly once. Scale by "
        "starting more replicas, each with its own stable --replica-id.",
    )
    _add_processor_arguments(processor)
    processor.set_defaults(handler=_run_processor)
    both = group.add_parser(
        "all",
        help="run a processor replica and an activity worker in one process",
        description="A processor replica and an activity worker side by side: the simplest "
        "deployment, and what the demo uses.",
    )
    _add_processor_arguments(both)
    both.add_argument("--concurrency", type=int, help="activities running at once (default 16)")
    both.add_argument("--worker-id", help="stable, unique id of the worker (default worker-0)")
    both.set_defaults(handler=_run_all)


def _add_processor_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser)
    add_module_arguments(parser, "workflows")
    parser.add_argument("--replica-id", help="stable, unique id of this replica (processor-0)")
    parser.add_argument("--state-dir", help="folder for the RocksDB tables")
    parser.add_argument("--partitions", type=int, help="partition count of the topics (32)")
    kafka = parser.add_argument_group("Kafka integration")
    kafka.add_argument(
        "--trigger",
        action="append",
        default=[],
        metavar="TOPIC:WORKFLOW[:ACTION]",
        help="start WORKFLOW for each record of the business topic TOPIC (ACTION start, the "
        "default), or raise the event TOPIC on it (raise); the id is the record key "
        "(repeatable; adds to [[triggers]] in the config file)",
    )
    kafka.add_argument(
        "--publish-topic",
        action="append",
        default=[],
        metavar="TOPIC",
        help="a user topic workflows may publish to with ctx.publish (repeatable; adds to "
        "[publish] topics in the config file and $TURNSTILE_PUBLISH_TOPICS)",
    )
    add_log_level_argument(parser)
    add_metrics_arguments(parser)


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    """Settings checked before anything runs: the user's workflows import, the contracts
    load, and Kafka answers (each failure stops the process with its reason)."""
    configure_logging(args)
    tune_gc()
    log.info("contracts: %s", check_contracts())
    settings = connected_settings(
        args,
        replica_id=args.replica_id,
        state_dir=args.state_dir,
        partitions=args.partitions,
        **extra,
    )
    settings = with_integration_flags(settings, args.trigger, args.publish_topic)
    log.info("wire format: %s", _wire_format_line(settings))
    import_modules([*settings.modules, *args.modules])
    require_registered(default_registry.workflows(), "workflows")
    kafka_admin.ensure_topics(settings, load_spec(), settings.connect_timeout_s)
    check_integration_topics(settings, default_registry)
    return settings


def _wire_format_line(settings: Settings) -> str:
    """Check the Schema Registry (if one is set) before anything joins a group; a line for
    the log saying how history, status and outcomes are written."""
    wire = connect_schema_registry(settings)
    if not wire.schema_ids:
        return settings.wire_format
    ids = ", ".join(f"{topic} id {schema_id}" for topic, schema_id in wire.schema_ids.items())
    return f"{settings.wire_format} ({settings.schema_registry_url}: {ids})"


def _run_processor(args: argparse.Namespace) -> int:
    settings = _settings(args)
    runner, metrics = observed_processor(settings, CollectorRegistry(), args)
    stop = threading.Event()
    reporter = threading.Thread(target=report_progress, args=(runner, stop), daemon=True)
    reporter.start()
    with (
        metrics_endpoint(args, metrics.registry, lambda: metrics.ready),
        stop_on_signals(stop, logger=log),
        trigger_bridge(settings, stop),
    ):
        runner.run(stop)
    return 0


def _run_all(args: argparse.Namespace) -> int:
    settings = _settings(args, worker_concurrency=args.concurrency, worker_id=args.worker_id)
    stop = threading.Event()
    registry = CollectorRegistry()
    worker = KafkaWorker(
        settings, default_registry, metrics=WorkerMetrics(registry), tracing=process_tracing()
    )
    worker_thread = threading.Thread(target=worker.run, args=(stop,), name="worker")
    runner, metrics = observed_processor(settings, registry, args)
    reporter = threading.Thread(target=report_progress, args=(runner, stop), daemon=True)
    with (
        metrics_endpoint(args, registry, lambda: metrics.ready),
        stop_on_signals(stop, STOP_GRACE_S + worker.shutdown_timeout_s, logger=log),
        trigger_bridge(settings, stop),
    ):
        worker_thread.start()
        reporter.start()
        try:
            runner.run(stop)
        finally:
            stop.set()  # a processor that dies must not leave the worker running alone
            worker_thread.join(timeout=60)
    return 0


def report_progress(runner: ProcessorRunner, stop: threading.Event, every_s: float = 10.0) -> None:
    """A progress line every few seconds while there is work, so operators see it moving."""
    last = 0
    while not stop.wait(every_s):
        p = runner.progress
        if p.records != last:
            log.info(
                "partitions %s: %d records, %d turns, %d completed, %d transactions, "
                "%d aborts, %d dead letters",
                sorted(runner.partitions),
                p.records,
                p.turns,
                p.completed,
                p.transactions,
                p.aborts,
                p.dead_letters,
            )
            last = p.records
