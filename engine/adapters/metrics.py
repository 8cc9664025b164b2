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
from collections.abc import Callable, Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from engine.core.errors import ConfigurationError
from engine.core.history import RuntimeStatus
from engine.services.processor.partition import PartitionProcessor
from engine.services.processor.protocol import Step
from engine.services.processor.state import TIMER_LATENESS_MS, Progress

__all__ = ["MetricsServer", "ProcessorMetrics", "WorkerMetrics"]

log = logging.getLogger(__name__)

#: Seconds: from 0.5 ms (an inline turn) to 10 s (a stuck commit).
_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
#: Seconds: activities and restores run from milliseconds to minutes.
_SLOW = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
_BATCH = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)
#: The commit protocol's steps that are phases of the transaction.
PHASES = (Step.PRODUCE, Step.OFFSETS, Step.COMMIT)

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


class Replica(Protocol):
    """What the metrics read from a processor replica (``ProcessorRunner`` is one)."""

    @property
    def progress(self) -> Progress: ...
    @property
    def partitions(self) -> dict[int, PartitionProcessor]: ...
    @property
    def lag(self) -> dict[tuple[str, int], int]: ...
    @property
    def ready(self) -> bool: ...
    @property
    def standby_lag(self) -> dict[int, int]: ...
    @property
    def standby_applied(self) -> int: ...


class ProcessorMetrics:
    """A processor replica's metrics.

    The commit protocol's steps arrive through :meth:`observe`, the ``BatchMetrics`` hook
    (``ProcessorRunner(..., metrics=...)``): turn and transaction-phase durations, batch
    sizes, transactions and aborts. Everything else is already counted by the replica
    (``ProcessorRunner.progress``: the partitions' ``Counters``, tallies by kind included;
    each partition's cache and instance counts; the consumer lag), so a scrape reads it
    from the runner given to :meth:`watch` instead of the loop doing the work twice.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.turn_seconds = Histogram(
            "turnstile_turn_duration_seconds",
            "Time to run a batch's turns and close its partitions' batches (protocol step 4)",
            buckets=_FAST,
            registry=r,
        )
        phase = Histogram(
            "turnstile_transaction_phase_seconds",
            "Time spent per transaction phase (protocol steps produce, offsets, commit)",
            ["phase"],
            buckets=_FAST,
            registry=r,
        )
        self._phases = {step: phase.labels(step.value) for step in PHASES}
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
        self.records_out = Counter(
            "turnstile_records_out", "Records produced in committed transactions", registry=r
        )
        self._accepted = 0  # records accepted by the batch in progress
        self._batch_records = 0  # the batch's records, once its timers fired
        self._produced = 0
        #: The records of the batch whose transaction commits next (its produce came after
        #: the next batch's accepts may have begun: the loop overlaps them, kafka.inflight).
        self._committing = 0
        self._runner: Replica | None = None
        r.register(_ReplicaCollector(self))

    def watch(self, runner: Replica) -> None:
        """Serve what ``runner`` counts (its progress, partitions and lag) on each scrape."""
        self._runner = runner

    @property
    def runner(self) -> Replica | None:
        return self._runner

    @property
    def ready(self) -> bool:
        """True once the watched replica has had its first assignment restored."""
        return self._runner is not None and self._runner.ready

    def observe(self, step: Step, seconds: float, count: int) -> None:
        """One step of the commit protocol (``BatchMetrics``); called on the loop's thread."""
        if step is Step.ACCEPT:
            self._accepted += count
        elif step is Step.TIMERS:  # every accept of the batch is done
            self._batch_records, self._accepted = self._accepted, 0
        elif step is Step.STEP:
            self.turn_seconds.observe(seconds)
        elif step in self._phases:
            self._phases[step].observe(seconds)
            if step is Step.PRODUCE:
                self._produced, self._committing = count, self._batch_records
            elif step is Step.COMMIT:
                self.transactions.inc()
                self.batch_size.observe(self._committing)
                self.records_out.inc(self._produced)
        elif step is Step.ABORT:
            self.aborts.inc()


class _ReplicaCollector(Collector):
    """Reads the watched replica's totals at scrape time (on the HTTP thread: it only
    copies plain dicts and numbers the loop thread writes, never calls the consumer)."""

    def __init__(self, metrics: ProcessorMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        runner = self._metrics.runner
        if runner is None:  # the families exist (with no samples) before a runner does
            yield from _progress_families(Progress())
            yield from _partition_families([], {})
            yield from _standby_families({}, 0)
            return
        yield from _progress_families(runner.progress)
        yield from _partition_families(sorted(dict(runner.partitions).items()), dict(runner.lag))
        yield from _standby_families(dict(runner.standby_lag), runner.standby_applied)


def _standby_families(lags: dict[int, int], applied: int) -> Iterator[Metric]:
    """The warm copies this replica keeps (``standby_replicas``): how far behind each is."""
    lag = GaugeMetricFamily(
        "turnstile_standby_lag_records",
        "Changelog offsets a standby copy of a partition is behind the committed end",
        labels=["partition"],
    )
    for p, n in sorted(lags.items()):
        lag.add_metric([str(p)], n)
    yield lag
    yield GaugeMetricFamily(
        "turnstile_standby_partitions", "Partitions this replica keeps standby copies of", len(lags)
    )
    yield CounterMetricFamily(
        "turnstile_standby_records_applied", "Changelog records applied to standby copies", applied
    )


#: The labelled counters of :class:`Progress`: metric name, help, labels, Progress field.
_LABELLED_COUNTERS: tuple[tuple[str, str, list[str], str], ...] = (
    ("turnstile_records_in", "Input records consumed", ["topic"], "topics"),
    (
        "turnstile_dead_letters",
        "Input records parked as dead letters",
        ["reason"],
        "dead_letter_kinds",
    ),
    (
        "turnstile_rejected",
        "Inbound records or callbacks refused (stale, for an ended instance, refused start)",
        ["kind"],
        "rejected_kinds",
    ),
    (
        "turnstile_command_outcomes",
        "Commands answered, by command and result (accepted, buffered, refused, duplicate)",
        ["command", "result"],
        "command_outcomes",
    ),
    (
        "turnstile_command_refusals",
        "Commands refused, by command and the error the client raises",
        ["command", "error"],
        "refusals",
    ),
    (
        "turnstile_workflow_runs",
        "Workflow runs started and ended, by workflow and outcome",
        ["workflow", "version", "event"],
        "workflow_runs",
    ),
)


def _progress_families(p: Progress) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "turnstile_turns", "Workflow turns run (one per touched instance and batch)", p.turns
    )
    for name, help_text, labels, attr in _LABELLED_COUNTERS:
        tallies: dict[Any, int] = dict(getattr(p, attr))
        values = {(k if isinstance(k, tuple) else (k,)): n for k, n in tallies.items()}
        yield _labelled(CounterMetricFamily(name, help_text, labels=labels), values)
    yield _lateness(p)
    lookups = CounterMetricFamily(
        "turnstile_instance_cache_lookups",
        "Instance cache lookups by result (hit, miss)",
        labels=["result"],
    )
    lookups.add_metric(["hit"], p.cache_hits)
    lookups.add_metric(["miss"], p.cache_misses)
    yield lookups
    yield CounterMetricFamily(
        "turnstile_restores", "Restores of newly assigned partitions", p.restores
    )
    yield CounterMetricFamily(
        "turnstile_restore_seconds",
        "Time spent restoring newly assigned partitions' tables",
        p.restore_s,
    )
    yield CounterMetricFamily(
        "turnstile_restored_records",
        "Changelog records applied while restoring",
        p.restored_records,
    )


def _lateness(p: Progress) -> Metric:
    counts = dict(p.timer_lateness)
    buckets, total = [], 0
    for bound in TIMER_LATENESS_MS:
        total += counts.get(bound, 0)
        buckets.append((str(bound / 1000), float(total)))
    buckets.append(("+Inf", float(total + counts.get(None, 0))))
    return HistogramMetricFamily(
        "turnstile_timer_lateness_seconds",
        "How long after its due time a durable timer fired",
        buckets=buckets,
        sum_value=p.timer_late_ms / 1000,
    )


def _partition_families(
    partitions: list[tuple[int, PartitionProcessor]], lags: dict[tuple[str, int], int]
) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "turnstile_partitions_owned", "Partitions this replica owns (restored)", len(partitions)
    )
    cache = GaugeMetricFamily(
        "turnstile_instance_cache_size", "Instances held in memory", labels=["partition"]
    )
    instances = GaugeMetricFamily(
        "turnstile_instances",
        "Instances per status on each owned partition",
        labels=["partition", "status"],
    )
    for p, pp in partitions:
        cache.add_metric([str(p)], len(pp.cache))
        if pp.statuses is not None:
            counts = pp.statuses.snapshot()
            for status in RuntimeStatus:
                instances.add_metric([str(p), status.value], counts.get(status, 0))
    lag = GaugeMetricFamily(
        "turnstile_consumer_lag_records",
        "Records between the replica's committed position and the partition's end",
        labels=["topic", "partition"],
    )
    for (topic, p), n in sorted(lags.items()):
        lag.add_metric([topic, str(p)], n)
    yield from (cache, instances, lag, _by_version(partitions))


#: At most this many (workflow, version) label pairs per replica; the rest are summed as
#: ``OTHER`` (names and versions come from starts, so their number is the user's to bound).
MAX_VERSION_LABELS = 100
OTHER = "(other)"


def _by_version(partitions: list[tuple[int, PartitionProcessor]]) -> Metric:
    family = GaugeMetricFamily(
        "turnstile_instances_by_version",
        "Open instances (PENDING, RUNNING, SUSPENDED, PARKED) per workflow and version on the "
        "owned partitions: a version at 0 on every replica no longer runs anywhere",
        labels=["name", "version"],
    )
    totals: dict[tuple[str, str], int] = {}
    for _, pp in partitions:
        if pp.statuses is not None:
            for key, n in pp.statuses.versions().items():
                totals[key] = totals.get(key, 0) + n
    ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))
    other = sum(n for _, n in ranked[MAX_VERSION_LABELS:])
    for (name, version), n in sorted(ranked[:MAX_VERSION_LABELS]):
        family.add_metric([name, version], n)
    if other:
        family.add_metric([OTHER, OTHER], other)
    return family


F = TypeVar("F", CounterMetricFamily, GaugeMetricFamily)


def _labelled(family: F, values: Mapping[tuple[str, ...], int]) -> F:
    for labels, n in sorted(values.items()):
        family.add_metric(list(labels), n)
    return family


class WorkerLoad(Protocol):
    """What the load gauges read of a worker loop."""

    @property
    def running(self) -> int: ...

    @property
    def queued(self) -> int: ...


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

        self.unserved_tasks = _Children(
            Counter(
                "turnstile_activity_unserved",
                "Tasks of activities this worker does not register, put back on their task "
                "queue for a worker that does",
                ["activity", "task_queue"],
                registry=r,
            )
        )
        self._workers: list[WorkerLoad] = []

    def attach(self, in_flight: Callable[[], int], queued: Callable[[], int]) -> None:
        """Read the worker's load at scrape time."""
        self.in_flight.set_function(in_flight)
        self.queue_depth.set_function(queued)

    def attach_worker(self, worker: WorkerLoad) -> None:
        """Add a worker loop (one per task queue) whose load the gauges sum at scrape time."""
        workers = self._workers
        workers.append(worker)
        self.attach(lambda: sum(w.running for w in workers), lambda: sum(w.queued for w in workers))

    def unserved(self, activity: str, task_queue: str) -> None:
        self.unserved_tasks(activity, task_queue).inc()

    def started(self, activity: str) -> None:
        self.attempts(activity).inc()

    def finished(self, activity: str, result: str, duration_s: float) -> None:
        self.results(activity, result).inc()
        self.duration(activity).observe(duration_s)

    def consumer_lag(self, partition: int, lag: int, task_queue: str = "default") -> None:
        self.lag(_lag_label(partition, task_queue)).set(max(lag, 0))

    def partitions_dropped(self, partitions: Iterable[int], task_queue: str = "default") -> None:
        for p in partitions:
            self.lag.remove(_lag_label(p, task_queue))


def _lag_label(partition: int, task_queue: str) -> str:
    """The ``partition`` label: the number on the default queue, ``<queue>/<number>`` on
    the others (one worker process may serve several task queues)."""
    return str(partition) if task_queue == "default" else f"{task_queue}/{partition}"


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
