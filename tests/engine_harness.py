"""Run the whole engine against a real broker for end-to-end tests.

    with running_engine(kafka_bootstrap) as engine:
        instance = engine.client.start("chain3.inline", 1)
        assert engine.client.wait_for_completion(instance, timeout=60).output == 4
        events = engine.history(instance)

:func:`running_engine` creates the topics of a fresh namespace, runs processor replica(s)
and an activity worker - as threads of the test process (``in_process=True``) or as
``python -m engine run processor|worker`` subprocesses that a test can SIGKILL and restart
with the same ids - and yields a :class:`RunningEngine` with the settings, a client and
readers for the engine's topics (read_committed, to the end).

Subprocesses run from the repository root, so ``--module tests.workflows_for_tests`` and
``--module engine.examples.chain3`` import there; each replica gets its own state folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    # ``tests.workflows_for_tests`` must import the same way here as in subprocesses.
    sys.path.insert(0, str(REPO_ROOT))

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402

from engine.adapters.kafka.admin import admin_for, apply  # noqa: E402
from engine.adapters.kafka.config import consumer_config, producer_config  # noqa: E402
from engine.adapters.kafka.io import log_end_offsets  # noqa: E402
from engine.client import Client  # noqa: E402
from engine.codec import decode_history, decode_message, encode_message  # noqa: E402
from engine.config.settings import Settings, load_settings  # noqa: E402
from engine.config.topics import TopicNames, load_spec, topic_names  # noqa: E402
from engine.core.history import HistoryEvent  # noqa: E402
from engine.core.messages import InstanceStatus, Message  # noqa: E402

DEFAULT_MODULES = ("engine.examples.chain3", "engine.examples.orders", "tests.workflows_for_tests")
READ_TIMEOUT = 60.0


# --- records ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One record read back from a topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp_ms: int


def read_topic(
    bootstrap: str, topic: str, partitions: int | None = None, timeout: float = READ_TIMEOUT
) -> list[Record]:
    """Every committed record of ``topic`` (read_committed), from the start to the log end as
    of now (waiting while an open transaction holds the last stable offset short of it), in
    partition then offset order."""
    consumer = Consumer(
        consumer_config(
            bootstrap,
            f"harness-reader-{uuid.uuid4().hex}",
            **{"enable.partition.eof": True, "fetch.wait.max.ms": 10},
        )
    )
    try:
        if partitions is None:
            meta = consumer.list_topics(topic, timeout=timeout).topics[topic]
            partitions = len(meta.partitions)
        wanted = [TopicPartition(topic, p, 0) for p in range(partitions)]
        ends = log_end_offsets(consumer_config(bootstrap, "harness-reader"), wanted)
        consumer.assign(wanted)
        pending = set(range(partitions))
        out: list[Record] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end within {timeout}s")
            for m in consumer.consume(1000, 0.2):
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if (m.offset() or 0) >= ends[(topic, m.partition() or 0)][1]:
                            pending.discard(m.partition())
                        continue
                    if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        continue
                    raise RuntimeError(f"reading {topic}: {error}")
                out.append(
                    Record(
                        topic,
                        m.partition() or 0,
                        m.offset() or 0,
                        m.key(),
                        m.value(),
                        {k: v for k, v in (m.headers() or [])},
                        m.timestamp()[1],
                    )
                )
    finally:
        consumer.close()
    out.sort(key=lambda r: (r.partition, r.offset))
    return out


def histories_of(records: Iterable[Record]) -> dict[str, list[tuple[bytes, HistoryEvent]]]:
    """History records grouped per instance, in topic order: ``(raw bytes, decoded event)``."""
    out: dict[str, list[tuple[bytes, HistoryEvent]]] = defaultdict(list)
    for r in records:
        assert r.value is not None, f"history record without a value at offset {r.offset}"
        event = decode_history(r.value)
        assert r.key == event.instance_id.encode(), f"history key {r.key!r} != {event}"
        out[event.instance_id].append((r.value, event))
    return dict(out)


def wait_until(
    condition: Callable[[], Any], timeout: float = 60.0, interval: float = 0.1, what: str = ""
) -> Any:
    """Poll ``condition`` until it returns something truthy (returned); fail after
    ``timeout`` seconds (a guard against hanging, never a performance assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)


# --- engine processes ---------------------------------------------------------------------------


class ThreadProcess:
    """A processor replica or worker running as a thread of the test process."""

    def __init__(self, name: str, target: Callable[[threading.Event], None]) -> None:
        self.name = name
        self._target = target
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            self._target(self._stop)
        except BaseException as exc:  # reported by stop() and by RunningEngine.check()
            self._error = exc
            raise

    def start(self) -> ThreadProcess:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def error(self) -> BaseException | None:
        return self._error

    def request_stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float = 60.0) -> None:
        self._thread.join(timeout)

    def stop(self, timeout: float = 60.0) -> None:
        self.request_stop()
        self.wait(timeout)


class EngineProcess:
    """A ``python -m engine run ...`` subprocess: start it, SIGKILL or SIGTERM it by PID."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str]):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> EngineProcess:
        assert not self.alive, f"{self.name} is already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start #{self.starts + 1}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        self.starts += 1
        return self

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill(self) -> None:
        """SIGKILL: no clean-up at all (open transactions stay open, no group leave)."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def pause(self) -> None:
        """SIGSTOP: the process freezes mid-work (a zombie once its group session expires)."""
        assert self.alive and self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: a paused process carries on as if nothing happened."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def request_stop(self) -> None:
        """SIGTERM (once): the process stops gracefully."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 60.0) -> int | None:
        """Wait for the process to exit (SIGKILL if it does not within ``timeout``)."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(30)
        return self.returncode

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait for a graceful exit (SIGKILL if it does not come)."""
        self.request_stop()
        return self.wait(timeout)

    def current_log(self) -> str:
        """What the current (latest) incarnation has logged so far."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        marker = f"=== start #{self.starts}:"
        return text[text.rfind(marker) :] if marker in text else text

    def wait_for_log(self, text: str, timeout: float = 120.0) -> None:
        """Wait until the current incarnation logged ``text`` (e.g. that it owns partitions)."""
        wait_until(
            lambda: text in self.current_log() or not self.alive,
            timeout,
            0.1,
            f"{self.name} to log {text!r}",
        )
        assert self.alive, f"{self.name} exited:\n{self.log_tail()}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


Handle = ThreadProcess | EngineProcess


# --- the running engine -------------------------------------------------------------------------


@dataclass
class RunningEngine:
    settings: Settings
    client: Client
    modules: tuple[str, ...]
    state_dir: Path
    in_process: bool
    #: Flags added to every processor subprocess (``--trigger``, ``--publish-topic``).
    processor_args: tuple[str, ...] = ()
    processors: dict[str, Handle] = field(default_factory=dict)
    workers: dict[str, Handle] = field(default_factory=dict)
    _producer: Producer | None = None

    @property
    def topics(self) -> TopicNames:
        return topic_names(self.settings.namespace)

    @property
    def bootstrap(self) -> str:
        return self.settings.bootstrap_servers

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    # --- processes --------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        env.pop("TURNSTILE_CONFIG", None)
        return env

    def _common_args(self) -> list[str]:
        args = []
        for module in self.modules:
            args += ["--module", module]
        return [
            *args,
            "--namespace",
            self.namespace,
            "--bootstrap-servers",
            self.bootstrap,
        ]

    def replica_state_dir(self, replica_id: str) -> Path:
        return self.state_dir / replica_id

    def start_processor(self, replica_id: str, state_dir: Path | None = None) -> Handle:
        """Start (or restart, with the same id and state folder) a processor replica."""
        state = state_dir or self.replica_state_dir(replica_id)
        existing = self.processors.get(replica_id)
        if isinstance(existing, EngineProcess) and state_dir is None:
            return existing.start()
        if self.in_process:
            from engine.adapters.kafka.processor import ProcessorRunner
            from engine.runtime.registry import default_registry

            settings = _replace(self.settings, replica_id=replica_id, state_dir=str(state))
            runner = ProcessorRunner(settings, default_registry)
            handle: Handle = ThreadProcess(replica_id, runner.run).start()
        else:
            argv = [
                sys.executable,
                "-m",
                "engine",
                "run",
                "processor",
                *self._common_args(),
                "--replica-id",
                replica_id,
                "--state-dir",
                str(state),
                "--partitions",
                str(self.settings.partitions),
                *self.processor_args,
            ]
            log = self.state_dir / "logs" / f"{replica_id}.log"
            handle = EngineProcess(replica_id, argv, log, self._env()).start()
        self.processors[replica_id] = handle
        return handle

    def start_worker(self, worker_id: str, concurrency: int = 16) -> Handle:
        """Start (or restart, with the same id) an activity worker."""
        existing = self.workers.get(worker_id)
        if isinstance(existing, EngineProcess):
            return existing.start()
        if self.in_process:
            from engine.adapters.kafka.worker import KafkaWorker
            from engine.runtime.registry import default_registry

            worker = KafkaWorker(
                self.settings,
                default_registry,
                worker_id=worker_id,
                concurrency=concurrency,
                shutdown_timeout_s=5.0,
            )
            handle: Handle = ThreadProcess(worker_id, worker.run).start()
        else:
            argv = [
                sys.executable,
                "-m",
                "engine",
                "run",
                "worker",
                *self._common_args(),
                "--worker-id",
                worker_id,
                "--concurrency",
                str(concurrency),
                "--shutdown-timeout",
                "5",
            ]
            log = self.state_dir / "logs" / f"{worker_id}.log"
            handle = EngineProcess(worker_id, argv, log, self._env()).start()
        self.workers[worker_id] = handle
        return handle

    def stop_all(self) -> None:
        """Ask everything to stop at once, then wait for each (a second SIGTERM would make
        a process exit without its clean shutdown, so each gets exactly one)."""
        handles = [*self.workers.values(), *self.processors.values()]
        for h in handles:
            h.request_stop()
        for h in handles:
            h.wait()

    def check(self) -> None:
        """Fail if an engine thread stopped with an error."""
        for h in [*self.processors.values(), *self.workers.values()]:
            if isinstance(h, ThreadProcess) and h.error is not None:
                raise AssertionError(f"{h.name} stopped with {h.error!r}") from h.error

    def logs(self, lines: int = 40) -> str:
        """The tails of the subprocesses' logs (for failure messages)."""
        parts = []
        for h in [*self.processors.values(), *self.workers.values()]:
            if isinstance(h, EngineProcess):
                parts.append(
                    f"--- {h.name} (pid {h.pid}, rc {h.returncode}) ---\n{h.log_tail(lines)}"
                )
        return "\n".join(parts)

    def wait_for_completion(self, instance_id: str, timeout: float = 120.0) -> Any:
        """The client's wait, failing with the engine processes' logs if it times out."""
        from engine.core.errors import WaitTimeoutError

        try:
            return self.client.wait_for_completion(instance_id, timeout)
        except WaitTimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.logs(60)}") from exc

    # --- producing ---------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> tuple[int, int]:
        """Write one raw record (murmur2 partitioner unless ``partition`` is given); returns
        the partition and offset it was written to."""
        if self._producer is None:
            self._producer = Producer(producer_config(self.bootstrap, client_id="harness"))
        written: list[tuple[int, int]] = []

        def delivered(error: KafkaError | None, message: Any) -> None:
            assert error is None, f"could not write to {topic}: {error}"
            written.append((message.partition(), message.offset()))

        kwargs: dict[str, Any] = {"key": key, "value": value, "headers": headers or []}
        if partition is not None:
            kwargs["partition"] = partition
        self._producer.produce(topic, on_delivery=delivered, **kwargs)
        assert self._producer.flush(30) == 0, f"could not write to {topic}"
        assert len(written) == 1
        return written[0]

    def send_command(self, message: Message) -> tuple[int, int]:
        """Encode a command with the engine's codec and write it to the commands topic."""
        return self.produce(
            self.topics.commands, encode_message(message), message.instance_id.encode()
        )

    # --- reading -----------------------------------------------------------------------------

    def read(self, topic: str) -> list[Record]:
        return read_topic(self.bootstrap, topic)

    def history_records(self) -> dict[str, list[tuple[bytes, HistoryEvent]]]:
        """The whole history topic, per instance: ``(raw bytes, event)`` in order."""
        return histories_of(self.read(self.topics.history))

    def histories(self) -> dict[str, list[HistoryEvent]]:
        return {i: [e for _, e in evs] for i, evs in self.history_records().items()}

    def history(self, instance_id: str) -> list[HistoryEvent]:
        """One instance's history events, in order (all generations)."""
        return self.histories().get(instance_id, [])

    def status_records(self, instance_id: str | None = None) -> list[InstanceStatus | None]:
        """Status-topic records in order (None for tombstones), optionally of one instance."""
        out: list[InstanceStatus | None] = []
        for r in self.read(self.topics.status):
            if instance_id is not None and r.key != instance_id.encode():
                continue
            if r.value is None:
                out.append(None)
                continue
            message = decode_message(r.value)
            assert isinstance(message, InstanceStatus)
            out.append(message)
        return out

    def final_statuses(self) -> dict[str, InstanceStatus]:
        """The latest status record of every instance on the status topic."""
        latest: dict[str, InstanceStatus] = {}
        for r in self.read(self.topics.status):
            key = (r.key or b"").decode()
            if r.value is None:
                latest.pop(key, None)
            else:
                message = decode_message(r.value)
                assert isinstance(message, InstanceStatus)
                latest[key] = message
        return latest

    def dead_letters(self) -> list[Record]:
        return self.read(self.topics.dead_letters)


def _replace(settings: Settings, **changes: Any) -> Settings:
    from dataclasses import replace

    return replace(settings, **changes)


def unique_namespace(prefix: str = "e2e") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topics(settings: Settings) -> None:
    result = apply(load_spec(), settings)
    assert not result.remaining.missing, f"topics missing after apply: {result.remaining}"


def delete_topics(settings: Settings) -> None:
    """Best effort: leftover topics must not fail a test."""
    admin = admin_for(settings)
    names = list(topic_names(settings.namespace).names())
    with contextlib.suppress(Exception):
        for future in admin.delete_topics(names, operation_timeout=30).values():
            with contextlib.suppress(Exception):
                future.result(30)


@contextlib.contextmanager
def running_engine(
    bootstrap: str,
    *,
    partitions: int = 4,
    namespace: str | None = None,
    modules: Sequence[str] = DEFAULT_MODULES,
    replicas: int = 1,
    workers: int = 1,
    in_process: bool = True,
    state_dir: Path | None = None,
    worker_concurrency: int = 16,
    keep_topics: bool = False,
    processor_args: Sequence[str] = (),
    settings_changes: dict[str, Any] | None = None,
) -> Iterator[RunningEngine]:
    """Topics of a fresh namespace, ``replicas`` processor replicas (``processor-<i>``) and
    ``workers`` activity workers (``worker-<i>``), and a client; everything stops on exit.
    ``settings_changes`` are further settings of the in-process engine and the client;
    subprocess replicas take theirs as ``processor_args``."""
    namespace = namespace or unique_namespace()
    cleanup_state = state_dir is None
    state = Path(state_dir or tempfile.mkdtemp(prefix=f"{namespace}-"))
    settings = load_settings(
        bootstrap_servers=bootstrap,
        namespace=namespace,
        partitions=partitions,
        state_dir=str(state),
        env={},
        **(settings_changes or {}),
    )
    if in_process:
        import importlib

        for module in modules:
            importlib.import_module(module)
    create_topics(settings)
    engine = RunningEngine(
        settings=settings,
        client=Client(settings=settings),
        modules=tuple(modules),
        state_dir=state,
        in_process=in_process,
        processor_args=tuple(processor_args),
    )
    try:
        for i in range(replicas):
            engine.start_processor(f"processor-{i}")
        for i in range(workers):
            engine.start_worker(f"worker-{i}", concurrency=worker_concurrency)
        yield engine
        engine.check()
    finally:
        try:
            engine.stop_all()
        finally:
            engine.client.close()
            if engine._producer is not None:
                engine._producer.flush(10)
            if not keep_topics:
                delete_topics(settings)
            if cleanup_state:
                import shutil

                shutil.rmtree(state, ignore_errors=True)


# --- history checks -----------------------------------------------------------------------------


def history_problems(instance_id: str, records: Sequence[tuple[bytes, HistoryEvent]]) -> list[str]:
    """What is wrong with one instance's history as read from the history topic: gaps or
    duplicates in the sequence, a generation without exactly one start and one end, a
    broken hash chain, an activity result applied twice or a scheduled task never settled."""
    from engine.codec import verify_history_chain
    from engine.core.errors import HistoryIntegrityError
    from engine.core.history import (
        ContinuedAsNew,
        ExecutionCompleted,
        ExecutionStarted,
        TaskCompleted,
        TaskFailed,
        TaskScheduled,
    )

    problems: list[str] = []
    events = [e for _, e in records]
    sequences = [e.sequence for e in events]
    if sequences != list(range(len(events))):
        problems.append(f"{instance_id}: sequence is {sequences}, not 0..{len(events) - 1}")
    try:
        verify_history_chain([raw for raw, _ in records])
    except HistoryIntegrityError as exc:
        problems.append(f"{instance_id}: {exc}")
    starts: dict[int, int] = defaultdict(int)
    ends: dict[int, int] = defaultdict(int)
    scheduled: dict[tuple[int, int], list[int]] = defaultdict(list)
    results: dict[tuple[int, int], list[tuple[str, int]]] = defaultdict(list)
    for e in events:
        body = e.body
        if isinstance(body, ExecutionStarted):
            starts[e.generation] += 1
        elif isinstance(body, ExecutionCompleted | ContinuedAsNew):
            ends[e.generation] += 1
        elif isinstance(body, TaskScheduled):
            scheduled[(e.generation, body.task_id)].append(body.attempt)
        elif isinstance(body, TaskCompleted | TaskFailed):
            results[(e.generation, body.task_id)].append((type(body).__name__, body.attempt))
    for generation in sorted(set(starts) | set(ends)):
        if starts[generation] != 1 or ends[generation] != 1:
            problems.append(
                f"{instance_id}: generation {generation} has {starts[generation]} start(s) and "
                f"{ends[generation]} end(s)"
            )
    for task, attempts in scheduled.items():
        got = results.get(task, [])
        if len(attempts) != len(set(attempts)):
            problems.append(f"{instance_id}: task {task} scheduled attempts {attempts}")
        if len(got) != len({a for _, a in got}):
            problems.append(f"{instance_id}: task {task} has results {got} (applied twice)")
        if sorted(a for _, a in got) != sorted(attempts):
            problems.append(f"{instance_id}: task {task} attempts {attempts} got results {got}")
    for task in set(results) - set(scheduled):
        problems.append(f"{instance_id}: result for unscheduled task {task}")
    return problems
