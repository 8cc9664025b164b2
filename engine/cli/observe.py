"""The metrics endpoint of ``run processor|worker|all`` (``--metrics-port``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry

from engine.adapters.metrics import MetricsServer

__all__ = ["metrics_endpoint"]


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
