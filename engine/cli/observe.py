"""The metrics of ``run processor|worker|all`` and ``demo``: the observed processor and the
endpoint (``--metrics-port``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry

from engine.adapters.kafka.processor import ProcessorRunner
from engine.adapters.metrics import MetricsServer, ProcessorMetrics
from engine.cli.traces import process_tracing
from engine.config.settings import Settings
from engine.runtime.registry import default_registry

__all__ = ["metrics_endpoint", "observed_processor"]


def observed_processor(
    settings: Settings, registry: CollectorRegistry, args: argparse.Namespace
) -> tuple[ProcessorRunner, ProcessorMetrics]:
    """A processor replica reporting to ``registry``; it counts instances per status only
    when the metrics are served (the count costs a scan of every owned partition)."""
    metrics = ProcessorMetrics(registry)
    runner = ProcessorRunner(
        settings,
        default_registry,
        metrics=metrics,
        count_statuses=args.metrics_port is not None,
        tracing=process_tracing(),
    )
    metrics.watch(runner)
    return runner, metrics


@contextmanager
def metrics_endpoint(
    args: argparse.Namespace, registry: CollectorRegistry, ready: Callable[[], bool]
) -> Iterator[MetricsServer | None]:
    """Serve ``registry`` while the block runs, if ``--metrics-port`` was given."""
    if args.metrics_port is None:
        yield None
        return
    server = MetricsServer(
        registry, host=args.metrics_host, port=args.metrics_port, ready=ready
    ).start()
    try:
        yield server
    finally:
        server.stop()
