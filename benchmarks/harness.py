"""Start what a benchmark measures against: a Kafka broker, topics, engine processes.

Engine processes run as subprocesses (``python -m engine run processor|worker``), exactly as
they are deployed, so that their CPU can be read per process from /proc and the client's
own work does not compete with them for one interpreter lock.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from common import REPO, progress

from engine.adapters.kafka.admin import admin_for, apply, broker_count, describe
from engine.config.settings import Settings, load_settings
from engine.config.topics import MIN_INSYNC, load_spec, topic_names
from engine.dev.local_cluster import LocalKafkaCluster
from engine.dev.local_kafka import LocalKafka

PYTHON = sys.executable
#: Kafka's own topics the workload writes to: transaction state, consumer offsets.
KAFKA_INTERNAL_TOPICS = ("__transaction_state", "__consumer_offsets")


@dataclass
class Broker:
    """A bootstrap address, and the broker's PID when this run started one broker
    (``node_pids``: every node's, when it started a cluster)."""

    bootstrap: str
    pid: int | None = None
    node_pids: tuple[int, ...] = ()

    @property
    def started_here(self) -> bool:
        """Whether this run started it (a fresh JVM to warm up, its CPU to read)."""
        return self.pid is not None or bool(self.node_pids)


@contextlib.contextmanager
def kafka(bootstrap: str | None = None, brokers: int = 1) -> Iterator[Broker]:
    """Use the given broker, or start a private one (``brokers`` > 1: a private local
    cluster of that many) in a fresh data folder and stop it at the end (a separate folder,
    so a developer's own local broker is left alone). The folder is deleted unless the
    block failed: then its broker logs are worth reading."""
    if bootstrap:
        yield Broker(bootstrap)
        return
    if brokers > 1:
        with _cluster(brokers) as cluster:
            yield cluster
        return
    data_dir = Path(tempfile.mkdtemp(prefix="turnstile-bench-kafka-"))
    broker = LocalKafka(data_dir=data_dir, progress=progress)
    with kept_if_failed(data_dir, "the broker's folder"):
        try:
            address = broker.start(timeout=180)
            yield Broker(address, broker.status().pid)
        finally:
            broker.stop()


@contextlib.contextmanager
def _cluster(size: int) -> Iterator[Broker]:
    """A private :class:`LocalKafkaCluster` of ``size`` nodes (each broker and controller),
    in a fresh folder; every node is stopped at the end (all at once, see its ``stop``)."""
    data_dir = Path(tempfile.mkdtemp(prefix="turnstile-bench-cluster-"))
    cluster = LocalKafkaCluster(data_dir=data_dir, size=size, progress=progress)
    with kept_if_failed(data_dir, "the cluster's folder"):
        try:
            address = cluster.start(timeout=240)
            pids = tuple(s.pid for s in cluster.status() if s.pid is not None)
            if len(pids) != size:
                raise RuntimeError(f"only {len(pids)} of {size} brokers run; see {data_dir}")
            progress(f"cluster of {size} brokers at {address} (pids {pids})")
            yield Broker(address, node_pids=pids)
        finally:
            cluster.stop()


@contextlib.contextmanager
def kept_if_failed(folder: Path, what: str) -> Iterator[Path]:
    """Delete ``folder`` after the block; keep it, and say where, when the block failed
    (its logs are worth reading then)."""
    try:
        yield folder
    except BaseException:
        progress(f"kept {what} for inspection: {folder}")
        raise
    shutil.rmtree(folder, ignore_errors=True)


def fresh_namespace(prefix: str) -> str:
    """A namespace nobody used before: every run starts from empty topics and groups."""
    return f"bench-{prefix}-{uuid.uuid4().hex[:8]}"


def create_topics(bootstrap: str, namespace: str, partitions: int) -> Settings:
    settings = load_settings(
        bootstrap_servers=bootstrap, namespace=namespace, partitions=partitions
    )
    apply(load_spec(), settings)
    return settings


@dataclass(frozen=True)
class Replication:
    """How many brokers a cluster has and how a namespace's topics are replicated on it,
    as the cluster describes them; ``kafka_topics``: the same two numbers (replication
    factor, ``min.insync.replicas``) for each of Kafka's own topics that exists."""

    brokers: int
    replication_factor: int
    min_insync_replicas: int
    kafka_topics: dict[str, tuple[int, int]]


def topic_replication(settings: Settings) -> Replication:
    """The replication factor and ``min.insync.replicas`` of every engine topic of the
    settings' namespace, read back from the cluster: a cluster number is only what it says
    if every topic the workload writes really has them. Raises if they disagree; Kafka's own
    transaction and offset topics (the nodes' settings, not the spec's) are reported apart."""
    names = topic_names(settings.namespace).names()
    admin = admin_for(settings)
    found = {
        name: (t.replication_factor, int(t.config.get(MIN_INSYNC, "1")))
        for name, t in describe(admin, [*names, *KAFKA_INTERNAL_TOPICS]).items()
    }
    missing = sorted(set(names) - set(found))
    pairs = {found[name] for name in names if name in found}
    if missing or len(pairs) != 1:
        raise RuntimeError(
            f"the topics of {settings.namespace} are not replicated alike: {sorted(pairs)} "
            f"(replication factor, min.insync.replicas), missing {missing}; see which with "
            f"'python -m engine topics check --bootstrap-servers {settings.bootstrap_servers} "
            f"--namespace {settings.namespace} --partitions {settings.partitions}'"
        )
    ((replication, in_sync),) = pairs
    kafka_topics = {name: found[name] for name in KAFKA_INTERNAL_TOPICS if name in found}
    return Replication(broker_count(admin), replication, in_sync, kafka_topics)


@dataclass
class EngineProcess:
    """One ``python -m engine run ...`` subprocess, logging to a file."""

    role: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def describe(self) -> str:
        """Whether it runs, and the end of its log: what a failed benchmark should show."""
        code = self.popen.poll()
        state = "running" if code is None else f"exited with code {code}"
        return f"{self.role} (pid {self.pid}) {state}; {self.log_path}:\n{_tail(self.log_path, 15)}"

    def check_alive(self) -> None:
        code = self.popen.poll()
        if code is not None:
            raise RuntimeError(
                f"the {self.role} exited with code {code}; see {self.log_path}:\n"
                + _tail(self.log_path)
            )

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a graceful stop), SIGKILL if it does not exit in time."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                progress(f"{self.role} (pid {self.pid}) did not stop in {timeout:.0f}s; killing")
                self.popen.kill()
                self.popen.wait(10)
        self._log.close()


_PROGRESS = re.compile(r"stopping: Progress\((.*)\)")


def final_progress(log_path: Path) -> dict[str, float] | None:
    """The processor's totals as it logs them when it stops (records, turns, transactions,
    and seconds spent per phase), or None if the line is not there."""
    try:
        matches = _PROGRESS.findall(log_path.read_text(errors="replace"))
    except OSError:
        return None
    if not matches:
        return None
    fields = (item.split("=", 1) for item in matches[-1].split(", ") if "=" in item)
    out: dict[str, float] = {}
    for name, value in fields:
        try:
            out[name] = round(float(value), 4)
        except ValueError:
            continue
    return out


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def spawn(
    role: str,
    settings: Settings,
    module: str,
    work_dir: Path,
    extra: list[str] | None = None,
    cpu: int | None = None,
    replica_id: str = "processor-0",
    env: dict[str, str] | None = None,
) -> EngineProcess:
    """Start ``python -m engine run <role>`` for the settings' namespace; optionally pinned
    to one CPU. A processor runs as ``replica_id`` (a second replica needs another id);
    ``env`` adds to the environment (``TURNSTILE_*`` settings)."""
    command = [
        PYTHON, "-m", "engine", "run", role,
        "--module", module,
        "--bootstrap-servers", settings.bootstrap_servers,
        "--namespace", settings.namespace,
        "--log-level", "INFO",
        *(extra or []),
    ]  # fmt: skip
    if role == "processor":
        command += [
            "--replica-id", replica_id,
            "--state-dir", str(work_dir / "state"),
            "--partitions", str(settings.partitions),
        ]  # fmt: skip
    name = role if replica_id == "processor-0" else replica_id
    log_path = work_dir / f"{name}.log"
    log = log_path.open("wb")
    environment = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    popen = subprocess.Popen(
        command,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environment,
    )
    if cpu is not None and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(popen.pid, {cpu})
    progress(f"started {role} (pid {popen.pid}), log {log_path}")
    return EngineProcess(role, popen, log_path, log)


@dataclass
class Engine:
    """The engine processes of one benchmark run, and where they keep their files."""

    settings: Settings
    work_dir: Path
    processes: list[EngineProcess]
    broker_pid: int | None = None
    #: Every node's PID when this run started a cluster (their CPU is read per node).
    node_pids: tuple[int, ...] = ()
    #: Filled when the block ends: the processor's own totals (see :func:`final_progress`).
    processor_progress: dict[str, float] | None = None

    @property
    def pids(self) -> dict[str, int]:
        """PIDs whose CPU a benchmark records: the engine processes and the broker (when
        this run started it; ``broker-1`` ... for each node of a cluster it started)."""
        pids = {p.role: p.pid for p in self.processes}
        if self.broker_pid is not None:
            pids["broker"] = self.broker_pid
        for number, pid in enumerate(self.node_pids, start=1):
            pids[f"broker-{number}"] = pid
        return pids

    def check_alive(self) -> None:
        for process in self.processes:
            process.check_alive()

    def describe(self) -> str:
        return "\n".join(p.describe() for p in self.processes)


@contextlib.contextmanager
def engine(
    broker: Broker,
    prefix: str,
    module: str,
    partitions: int,
    with_worker: bool,
    pin: bool = False,
    worker_concurrency: int | None = None,
    processor_args: list[str] | None = None,
) -> Iterator[Engine]:
    """Fresh namespace and topics, a processor (and a worker) running until the block ends.

    With ``pin`` the processor gets CPU 0 and the worker (and this client) CPU 1;
    ``processor_args`` are more options of ``run processor`` (``--metrics-port``).
    """
    namespace = fresh_namespace(prefix)
    settings = create_topics(broker.bootstrap, namespace, partitions)
    work_dir = Path(tempfile.mkdtemp(prefix=f"turnstile-bench-{prefix}-"))
    progress(f"namespace {namespace}, {partitions} partitions, files in {work_dir}")
    processes = [
        spawn("processor", settings, module, work_dir, processor_args, cpu=0 if pin else None)
    ]
    if pin:
        os.sched_setaffinity(0, {1})
    eng = Engine(settings, work_dir, processes, broker.pid, broker.node_pids)
    failed = True
    try:
        if with_worker:
            extra = [] if worker_concurrency is None else ["--concurrency", str(worker_concurrency)]
            processes.append(
                spawn("worker", settings, module, work_dir, extra, cpu=1 if pin else None)
            )
        yield eng
        failed = False
    finally:
        for process in reversed(processes):
            process.stop()
        eng.processor_progress = final_progress(processes[0].log_path)
        if pin:
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        if failed:
            shutil.rmtree(work_dir / "state", ignore_errors=True)
            progress(f"kept the engine's logs for inspection: {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
