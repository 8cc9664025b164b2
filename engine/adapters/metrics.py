"""Prometheus metrics of processors and workers, and the HTTP endpoint that serves them.

The loops call a few small methods (:class:`ProcessorMetrics`, :class:`WorkerMetrics`) with
what they already measure; everything here is cheap enough for every batch (a histogram
observation is about a microsecond). Names follow Prometheus conventions: a ``turnstile_``
prefix, ``_total`` counters, ``_seconds`` durations, and labels that are kinds, topics,
partitions and registered workflow or activity names - never an instance id.

One :class:`prometheus_client.CollectorRegistry` per process: ``run all`` puts the processor
and the worker on the same registry and the same port.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Generic, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from engine.core.errors import ConfigurationError
from engine.core.history import RuntimeStatus
from engine.services.processor.partition import Counters, InstanceCache

__all__ = ["MetricsServer", "ProcessorMetrics", "WorkerMetrics"]

log = logging.getLogger(__name__)

#: Seconds: from 0.5 ms (an inline turn) to 10 s (a stuck commit).
_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
#: Seconds: activities and restores run from milliseconds to minutes.
_SLOW = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
_BATCH = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)
PHASES = ("produce", "send_offsets", "commit")

M = TypeVar("M", Counter, Gauge, Histogram)


class _Children(Generic[M]):
    """A metric's labelled children, looked up once: ``labels()`` costs several
    microseconds a call, a dict lookup a few tens of nanoseconds."""

    def __init__(self, metric: M) -> None:
        self.metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *labels: str) -> M:
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self.metric.labels(*labels)
        return child

    def remove(self, *labels: str) -> None:
        if self._children.pop(labels, None) is not None:
            self.metric.remove(*labels)


class ProcessorMetrics:
    """A processor replica's metrics; fed by its loop, read by scrapes."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, count_instances: bool = False
    ) -> None:
        """``count_instances``: keep ``turnstile_instances`` by status, which costs one scan
        of the metadata rows per newly assigned partition (off unless metrics are served)."""
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.count_instances = count_instances
        self._ready = False
        self.turns = Counter(
            "turnstile_turns", "Workflow turns run (one per touched instance and batch)", registry=r
        )
        self.turn_seconds = Histogram(
            "turnstile_turn_duration_seconds",
            "Time to route a batch's records and run its turns, before the transaction",
            buckets=_FAST,
            registry=r,
        )
        self.phase_seconds = _Children(
            Histogram(
                "turnstile_transaction_phase_seconds",
                "Time spent per transaction phase (produce, send_offsets, commit)",
                ["phase"],
                buckets=_FAST,
                registry=r,
            )
        )
        self.batch_size = Histogram(
            "turnstile_batch_records",
            "Input records per committed batch",
            buckets=_BATCH,
            registry=r,
        )
        self.transactions = Counter("turnstile_transactions", "Transactions committed", registry=r)
        self.aborts = Counter(
            "turnstile_transaction_aborts",
            "Transactions aborted (the batch is redone)",
            registry=r,
        )
        self.records_in = _Children(
            Counter("turnstile_records_in", "Input records consumed", ["topic"], registry=r)
        )
        self.records_out = Counter(
            "turnstile_records_out", "Records produced in committed transactions", registry=r
        )
        self.dead_letters = _Children(
            Counter(
                "turnstile_dead_letters",
                "Input records parked as dead letters",
                ["reason"],
                registry=r,
            )
        )
        self.rejected = _Children(
            Counter(
                "turnstile_rejected",
                "Inbound records or callbacks refused (stale, for an ended instance, "
                "refused start)",
                ["kind"],
                registry=r,
            )
        )
        self.workflows = _Children(
            Counter(
                "turnstile_workflow_runs",
                "Workflow runs started and ended, by workflow and outcome",
                ["workflow", "version", "event"],
                registry=r,
            )
        )
        self.timer_lateness = Histogram(
            "turnstile_timer_lateness_seconds",
            "How long after its due time a durable timer fired",
            buckets=_FAST,
            registry=r,
        )
        self.restore_seconds = Histogram(
            "turnstile_restore_duration_seconds",
            "Time to restore the tables of newly assigned partitions",
            buckets=_SLOW,
            registry=r,
        )
        self.restored = Counter(
            "turnstile_restored_records",
            "Changelog records applied while restoring",
            registry=r,
        )
        self.owned = Gauge(
            "turnstile_partitions_owned",
            "Partitions this replica owns (restored)",
            registry=r,
        )
        self.cache_size = _Children(
            Gauge(
                "turnstile_instance_cache_size",
                "Instances held in memory",
                ["partition"],
                registry=r,
            )
        )
        self.cache_lookups = _Children(
            Counter(
                "turnstile_instance_cache_lookups",
                "Instance cache lookups by result (hit, miss)",
                ["result"],
                registry=r,
            )
        )
        self.lag = _Children(
            Gauge(
                "turnstile_consumer_lag_records",
                "Records between the replica's committed position and the partition's end",
                ["topic", "partition"],
                registry=r,
            )
        )
        self.instances = _Children(
            Gauge(
                "turnstile_instances",
                "Instances per status on each owned partition",
                ["partition", "status"],
                registry=r,
            )
        )
        self._seen: dict[int, tuple[int, int]] = {}
        self._records_in: dict[str, int] = {}

    # --- readiness --------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """True once the replica has had its first assignment restored (and owns it)."""
        return self._ready

    def partitions_owned(self, partitions: Sequence[int]) -> None:
        """After an assignment is restored, or after a revocation."""
        self._ready = True
        self.owned.set(len(partitions))
        for p in list(self._seen):
            if p not in partitions:
                del self._seen[p]
                self.cache_size.remove(str(p))
                for status in RuntimeStatus:
                    self.instances.remove(str(p), status.value)

    # --- per record, per partition, per batch -----------------------------------------------

    def record_in(self, topic: str) -> None:
        """One input record (a dict increment; flushed to the counter once per batch)."""
        self._records_in[topic] = self._records_in.get(topic, 0) + 1

    def partition_batch(self, partition: int, counters: Counters, cache: InstanceCache) -> None:
        """A partition's counters for the batch that is about to commit."""
        if counters.turns:
            self.turns.inc(counters.turns)
        for kind, n in counters.dead_letter_kinds.items():
            self.dead_letters(kind).inc(n)
        for kind, n in counters.rejected_kinds.items():
            self.rejected(kind).inc(n)
        for (name, version, event), n in counters.workflow_events.items():
            self.workflows(name, version, event).inc(n)
        for late_ms in counters.timer_lateness_ms:
            self.timer_lateness.observe(max(late_ms, 0) / 1000)
        self.cache_size(str(partition)).set(len(cache))
        hits, misses = self._seen.get(partition, (0, 0))
        if cache.hits < hits or cache.misses < misses:  # a new cache: the partition came back
            hits, misses = 0, 0
        self.cache_lookups("hit").inc(cache.hits - hits)
        self.cache_lookups("miss").inc(cache.misses - misses)
        self._seen[partition] = (cache.hits, cache.misses)

    def turn(self, duration_s: float) -> None:
        self.turn_seconds.observe(duration_s)

    def phase(self, name: str, duration_s: float) -> None:
        self.phase_seconds(name).observe(duration_s)

    def batch(self, outputs: int) -> None:
        """A committed transaction that produced ``outputs`` records; its size is the input
        records counted by :meth:`record_in` since the last one."""
        self.transactions.inc()
        self.batch_size.observe(sum(self._records_in.values()))
        self.records_out.inc(outputs)
        for topic, n in self._records_in.items():
            self.records_in(topic).inc(n)
        self._records_in.clear()

    def abort(self) -> None:
        self.aborts.inc()
        self._records_in.clear()  # the batch is consumed again

    def consumer_lag(self, topic: str, partition: int, lag: int) -> None:
        self.lag(topic, str(partition)).set(max(lag, 0))

    def instance_statuses(self, partition: int, counts: dict[RuntimeStatus, int]) -> None:
        """The partition's committed instances per status (after its first count, then
        whenever a commit changed them)."""
        self._seen.setdefault(partition, (0, 0))
        for status in RuntimeStatus:
            self.instances(str(partition), status.value).set(counts.get(status, 0))

    def restored_partitions(self, records: int, seconds: float) -> None:
        """One restore of newly assigned partitions (all of them together)."""
        self.restore_seconds.observe(seconds)
        self.restored.inc(records)


class WorkerMetrics:
    """An activity worker's metrics; implements the worker's ``ActivityObserver``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.attempts = _Children(
            Counter(
                "turnstile_activity_attempts", "Activity attempts started", ["activity"], registry=r
            )
        )
        self.results = _Children(
            Counter(
                "turnstile_activity_results",
                "Activity attempts finished, by result (success, failure, timeout)",
                ["activity", "result"],
                registry=r,
            )
        )
        self.duration = _Children(
            Histogram(
                "turnstile_activity_duration_seconds",
                "Run time of an activity attempt",
                ["activity"],
                buckets=_SLOW,
                registry=r,
            )
        )
        self.in_flight = Gauge(
            "turnstile_activities_in_flight", "Activities running now", registry=r
        )
        self.queue_depth = Gauge(
            "turnstile_activity_queue_depth",
            "Tasks taken and waiting for a free slot",
            registry=r,
        )
        self.lag = _Children(
            Gauge(
                "turnstile_worker_lag_records",
                "Activity tasks between the worker's committed offset and the partition's end",
                ["partition"],
                registry=r,
            )
        )

    def attach(self, in_flight: Callable[[], int], queued: Callable[[], int]) -> None:
        """Read the worker's load at scrape time."""
        self.in_flight.set_function(in_flight)
        self.queue_depth.set_function(queued)

    def started(self, activity: str) -> None:
        self.attempts(activity).inc()

    def finished(self, activity: str, result: str, duration_s: float) -> None:
        self.results(activity, result).inc()
        self.duration(activity).observe(duration_s)

    def consumer_lag(self, partition: int, lag: int) -> None:
        self.lag(str(partition)).set(max(lag, 0))

    def partitions_dropped(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self.lag.remove(str(p))


# --- the endpoint ------------------------------------------------------------------------------


class MetricsServer:
    """``/metrics`` (Prometheus text format), ``/healthz`` (the process is alive) and
    ``/readyz`` (200 once ``ready()`` is true, else 503) on one port, on a daemon thread."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        host: str = "127.0.0.1",
        port: int = 9464,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        handler = _handler(registry, ready)
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror}; choose another "
                f"--metrics-port (or stop what uses it)"
            ) from exc
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> MetricsServer:
        self._thread.start()
        log.info("metrics on %s/metrics (health: /healthz, /readyz)", self.url)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(
    registry: CollectorRegistry, ready: Callable[[], bool]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b"ok\n")
            elif path == "/readyz":
                is_ready = ready()
                self._send(200 if is_ready else 503, b"ready\n" if is_ready else b"restoring\n")
            else:
                self._send(404, b"not found: try /metrics, /healthz or /readyz\n")

        def _send(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # scrapes every few seconds would flood the log

    return Handler
