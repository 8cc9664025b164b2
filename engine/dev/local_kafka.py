"""A real Apache Kafka broker for development, tests and CI, run from the jars on Maven Central.

Why not a fake or an in-memory stand-in: the engine's exactly-once guarantee rests on Kafka
transactions, read_committed isolation and transactional offset commits; a stand-in that gets
any of those subtly wrong would let broken code pass. Why not Docker: it is not everywhere
(CI runners, sandboxes), while Java and Maven usually are. So this module fetches the pinned
``kafka_2.13`` jars once into a cache, formats a single-node KRaft log and runs ``kafka.Kafka``
as a combined broker+controller bound to 127.0.0.1.

It imports only the standard library so that ``python -m engine dev kafka ...`` starts fast
and works before any Kafka client library is installed.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.core.errors import LocalKafkaError
from engine.dev.kafka_security import BrokerSecurity

__all__ = [
    "KAFKA_VERSION",
    "BrokerStatus",
    "ClusterNode",
    "LocalKafka",
    "default_cache_dir",
    "default_data_dir",
]

KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
LOG4J_VERSION = "2.24.3"
# kafka_2.13 depends on slf4j-api 1.7, which cannot see the SLF4J 2 provider of log4j: pin 2.x.
SLF4J_VERSION = "2.0.16"

CACHE_DIR_ENV = "TURNSTILE_CACHE_DIR"
DATA_DIR_ENV = "TURNSTILE_KAFKA_DIR"
HOST = "127.0.0.1"

_MARKER = ".complete"
_PID_FILE = "broker.pid"
_PORT_FILE = "broker.port"
_LOG_FILE = "broker.log"
_STDOUT_FILE = "broker.out"
_CONFIG_FILE = "server.properties"
_LOG4J_FILE = "log4j2.xml"
_LOG_DIR = "kraft-logs"
_OWN_ENTRIES = frozenset(
    {_PID_FILE, _PORT_FILE, _LOG_FILE, f"{_LOG_FILE}.1", _STDOUT_FILE, _CONFIG_FILE, _LOG4J_FILE,
     _LOG_DIR}
)  # fmt: skip
_READY_MARKERS = ("Kafka Server started", "started (kafka.server.KafkaRaftServer)")

# Small heap and a single-threaded collector: the broker shares two cores with the tests.
_JVM_OPTIONS = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)


def default_cache_dir() -> Path:
    """Where downloaded jars live: ``$TURNSTILE_CACHE_DIR`` or ``~/.cache/turnstile``."""
    configured = os.environ.get(CACHE_DIR_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "turnstile"


def default_data_dir() -> Path:
    """Where the broker keeps its config, logs and data: ``$TURNSTILE_KAFKA_DIR`` or
    ``<cache dir>/broker``."""
    configured = os.environ.get(DATA_DIR_ENV)
    return Path(configured).expanduser() if configured else default_cache_dir() / "broker"


def _progress(message: str) -> None:
    """Progress goes to stderr so that stdout carries only results (the bootstrap address)."""
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ClusterNode:
    """This broker's place in a local cluster (``engine.dev.local_cluster``): its node id,
    fixed ports, the controller quorum (``id@host:port`` of every node, each node being both
    broker and controller) and the cluster id every node is formatted with."""

    node_id: int
    broker_port: int
    controller_port: int
    voters: str
    cluster_id: str
    size: int


@dataclass(frozen=True)
class BrokerStatus:
    """What ``status()`` reports; ``bootstrap_servers`` is set only while running."""

    running: bool
    pid: int | None
    bootstrap_servers: str | None
    data_dir: Path
    libs_dir: Path
    fetched: bool

    def describe(self) -> str:
        """A few human-readable lines for the CLI."""
        state = f"running (pid {self.pid})" if self.running else "stopped"
        lines = [
            f"broker:    {state}",
            f"bootstrap: {self.bootstrap_servers or '-'}",
            f"data dir:  {self.data_dir}",
            f"jars:      {self.libs_dir} ({'fetched' if self.fetched else 'not fetched'})",
        ]
        return "\n".join(lines)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Serialise fetch/start/stop between processes (a CI script and a test run, say)."""
    import fcntl  # POSIX only: imported here so that the CLI itself starts on any platform

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _free_port() -> int:
    """A port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    """Whether a server could listen on ``port`` now.

    SO_REUSEADDR, as the broker's own listener uses: connections of the previous run that
    linger in TIME_WAIT do not stop a new listener, so they must not make the port look busy
    (without it, every restart soon after a stop would move the broker to a new port).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def _can_connect(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
        return True
    return False


def _new_cluster_id() -> str:
    """A Kafka cluster ID: a random UUID in unpadded base64url, as ``kafka-storage random-uuid``
    prints it (Kafka also avoids IDs that start with '-', which look like CLI flags)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


def _tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a file, for error messages; empty if it does not exist."""
    try:
        content = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    # Some broker lines list hundreds of partitions: keep each one readable.
    return "\n".join(line[:500] for line in content.splitlines()[-lines:])


def _read_int(path: Path) -> int | None:
    """The integer a pid or port file holds, or None if it is missing or unreadable."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_properties(path: Path) -> dict[str, str]:
    """Parse the simple ``key=value`` lines of a Java properties file we wrote ourselves."""
    result: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.lstrip().startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                result[key.strip()] = value.strip()
    return result


def _pom_xml(version: str) -> str:
    """A throwaway POM whose only job is to let Maven resolve the broker's runtime jars."""
    deps = [
        ("org.apache.kafka", f"kafka_{SCALA_VERSION}", version),
        ("org.apache.logging.log4j", "log4j-api", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
        ("org.slf4j", "slf4j-api", SLF4J_VERSION),
    ]
    body = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.turnstile</groupId>
  <artifactId>local-kafka-jars</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
{body}
  </dependencies>
</project>
"""


def _log4j2_xml(log_file: Path) -> str:
    """Log to a file in the data folder (kept after stop, for debugging), INFO and up."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="file" fileName="{log_file}" append="false">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="kafka.log.LogCleaner" level="WARN"/>
    <Logger name="org.apache.kafka.storage.internals.log.LogCleaner" level="WARN"/>
    <Root level="INFO"><AppenderRef ref="file"/></Root>
  </Loggers>
</Configuration>
"""


def _cluster_properties(node: ClusterNode) -> dict[str, str]:
    """A node of a local cluster: its id, the static controller quorum, and the replication
    a cluster gives Kafka's own topics (transaction state, offsets): 3 copies, 2 in sync."""
    replicas = str(min(3, node.size))
    in_sync = str(min(2, node.size))
    return {
        "node.id": str(node.node_id),
        "controller.quorum.voters": node.voters,
        "default.replication.factor": replicas,
        "min.insync.replicas": in_sync,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": in_sync,
    }


def _server_properties(
    data_dir: Path,
    broker_port: int,
    controller_port: int,
    security: BrokerSecurity | None = None,
    node: ClusterNode | None = None,
) -> str:
    """Single-node KRaft settings: replication factors of 1, no automatic topic creation
    (the engine declares its topics), and no rebalance delay so that tests get their
    partition assignment at once. ``security`` secures the client listener (SASL/SCRAM over
    TLS, optionally ACLs: :mod:`engine.dev.kafka_security`)."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "listeners": f"PLAINTEXT://{HOST}:{broker_port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{broker_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "controller.quorum.bootstrap.servers": f"{HOST}:{controller_port}",
        "log.dirs": str(data_dir / _LOG_DIR),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        # Fewer internal partitions: the first consumer group / transaction is ready sooner.
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.num.partitions": "10",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.max.timeout.ms": "900000",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "10000",
        "group.initial.rebalance.delay.ms": "0",
        # Let fault tests choose short session timeouts (the default floor is 6 s).
        "group.min.session.timeout.ms": "1000",
        # The same for groups of the consumer protocol (KIP-848), whose session and
        # heartbeat are the broker's: floors of 45 s and 5 s by default.
        "group.consumer.min.session.timeout.ms": "1000",
        "group.consumer.min.heartbeat.interval.ms": "100",
        # The group coordinator batches its log appends for this long (default 5-10 ms);
        # every transactional offset commit (send_offsets_to_transaction) pays it in full.
        "group.coordinator.append.linger.ms": "0",
        # The active controller appends a no-op record to the metadata log this often when
        # nothing changes (default 500 ms), and the broker side applies each one: the
        # largest part of an idle broker's CPU. Liveness is the brokers' heartbeats' job.
        "metadata.max.idle.interval.ms": "5000",
    }
    if security is not None:
        settings.update(security.properties(HOST, broker_port, controller_port))
    if node is not None:
        del settings["controller.quorum.bootstrap.servers"]
        settings.update(_cluster_properties(node))
    lines = ["# Written by engine.dev.local_kafka; regenerated when ports change."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


class LocalKafka:
    """One local single-node Kafka broker, owned through its data folder.

    All state lives in files (pid, port, config, log) so that separate processes - a CLI
    call that starts the broker and a later one that stops it - agree on what is running.
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        cache_dir: Path | str | None = None,
        version: str = KAFKA_VERSION,
        port: int | None = None,
        progress: Callable[[str], None] = _progress,
        security: BrokerSecurity | None = None,
        node: ClusterNode | None = None,
    ) -> None:
        # Absolute paths: the broker runs in its data folder and is recognised by its
        # command line, so a relative path would point elsewhere or fail to match.
        self.data_dir = (Path(data_dir) if data_dir else default_data_dir()).expanduser().resolve()
        self.cache_dir = (
            (Path(cache_dir) if cache_dir else default_cache_dir()).expanduser().resolve()
        )
        self.version = version
        self.requested_port = port
        self.security = security
        self.node = node
        self._progress = progress
        self._process: subprocess.Popen[bytes] | None = None
        self._holds_lock = False
        self._launched_port = 0

    # --- paths --------------------------------------------------------------------------

    @property
    def libs_dir(self) -> Path:
        """The folder of jars for this Kafka version (shared by every data folder)."""
        return self.cache_dir / f"kafka-{self.version}" / "libs"

    @property
    def log_file(self) -> Path:
        """The broker's log4j log for its latest run (the one before is ``broker.log.1``)."""
        return self.data_dir / _LOG_FILE

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold this data folder's lock; re-entrant, since start may need to stop."""
        if self._holds_lock:
            yield
            return
        with _file_lock(self.data_dir.parent / f".{self.data_dir.name}.lock"):
            self._holds_lock = True
            try:
                yield
            finally:
                self._holds_lock = False

    # --- fetch --------------------------------------------------------------------------

    def is_fetched(self) -> bool:
        """Whether a previous fetch completed (the marker is written last)."""
        return (self.libs_dir / _MARKER).is_file()

    def fetch(self) -> Path:
        """Download the broker's jars with Maven once; later calls return at once."""
        if self.is_fetched():
            return self.libs_dir
        lock = self.libs_dir.parent.parent / f".kafka-{self.version}.lock"
        with _file_lock(lock):
            if self.is_fetched():
                return self.libs_dir
            self._run_maven()
        return self.libs_dir

    def _run_maven(self) -> None:
        mvn = shutil.which("mvn")
        if mvn is None:
            raise LocalKafkaError(
                "Maven ('mvn') is not on PATH; it is needed once to download the Kafka jars. "
                "Install it (Debian/Ubuntu: 'apt-get install maven'), or point "
                "ENGINE_BOOTSTRAP_SERVERS at a Kafka you already run (see docker-compose.yml)."
            )
        self._progress(
            f"Fetching Apache Kafka {self.version} jars from Maven Central into "
            f"{self.libs_dir} (first run only; can take a few minutes)..."
        )
        started = time.monotonic()
        staging = self.libs_dir.with_name("libs.partial")
        shutil.rmtree(staging, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="turnstile-kafka-pom-") as work:
            (Path(work) / "pom.xml").write_text(_pom_xml(self.version), encoding="utf-8")
            command = [
                mvn, "-B", "-q", "-f", str(Path(work) / "pom.xml"),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
            ]  # fmt: skip
            result = subprocess.run(command, cwd=work, capture_output=True, text=True)
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            output = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
            raise LocalKafkaError(
                f"Maven could not download Kafka {self.version} (exit {result.returncode}). "
                f"Check network access to Maven Central (or your ~/.m2/settings.xml mirror) "
                f"and retry 'python -m engine dev kafka fetch'.\n{output}"
            )
        shutil.rmtree(self.libs_dir, ignore_errors=True)
        staging.rename(self.libs_dir)
        (self.libs_dir / _MARKER).write_text(f"{self.version}\n", encoding="utf-8")
        count = sum(1 for _ in self.libs_dir.glob("*.jar"))
        self._progress(f"Fetched {count} jars in {time.monotonic() - started:.1f}s.")

    # --- state --------------------------------------------------------------------------

    def _pid(self) -> int | None:
        """The PID of the running broker of this data folder, or None."""
        pid = _read_int(self.data_dir / _PID_FILE)
        if pid is None:
            return None
        if self._process is not None and self._process.pid == pid:
            return pid if self._process.poll() is None else None
        return pid if self._is_our_broker(pid) else None

    def _is_our_broker(self, pid: int) -> bool:
        """Alive, not a zombie, and running this data folder's config (PIDs get reused)."""
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        proc = Path("/proc") / str(pid)
        if not proc.exists():
            return True  # no procfs (macOS): trust the signal check
        with contextlib.suppress(OSError):
            stat = (proc / "stat").read_text()
            if stat.rsplit(")", 1)[-1].split()[0] == "Z":
                return False
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        config = str(self.data_dir / _CONFIG_FILE).encode()
        return b"kafka.Kafka" in cmdline and config in cmdline

    def _port(self) -> int | None:
        return _read_int(self.data_dir / _PORT_FILE)

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>`` of the running broker; raises if it is not running."""
        port = self._port()
        if self._pid() is None or port is None:
            raise LocalKafkaError(
                f"the local Kafka broker in {self.data_dir} is not running; "
                f"start it with 'python -m engine dev kafka start'."
            )
        return f"{HOST}:{port}"

    def status(self) -> BrokerStatus:
        """Running or not, where, and whether the jars are present."""
        pid = self._pid()
        port = self._port()
        return BrokerStatus(
            running=pid is not None,
            pid=pid,
            bootstrap_servers=f"{HOST}:{port}" if pid is not None and port else None,
            data_dir=self.data_dir,
            libs_dir=self.libs_dir,
            fetched=self.is_fetched(),
        )

    # --- start --------------------------------------------------------------------------

    def start(self, timeout: float = 90.0, *, fresh: bool = False) -> str:
        """Start the broker (fetching jars first if needed) and return its bootstrap address.

        Idempotent: if this data folder's broker already runs, return its address. With
        ``fresh=True`` the data folder is wiped first (topics, offsets, everything).
        """
        with self._locked():
            if not self.launch(fresh=fresh):
                bootstrap = self.bootstrap_servers
                self._progress(f"Kafka is already running at {bootstrap} ({self.data_dir}).")
                return bootstrap
            return self.await_ready(timeout)

    def launch(self, *, fresh: bool = False) -> bool:
        """Start the broker process without waiting for it (the nodes of a cluster must all
        be launched before any of them can get ready); False when it already runs."""
        with self._locked():
            kept_port = self._port()
            if fresh:
                self.reset()
            if self._pid() is not None:
                return False
            java = self._require_java()
            self.fetch()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._launched_port = self._prepare_config(java, kept_port)
            self._launch(java, self._launched_port)
            return True

    def await_ready(self, timeout: float = 90.0) -> str:
        """Wait for a launched broker to be ready; returns its bootstrap address. A failed or
        interrupted start leaves nothing running."""
        try:
            return self._await_ready(self._launched_port, timeout)
        except BaseException:
            self.stop()
            raise

    def _require_java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise LocalKafkaError(
                "Java ('java') is not on PATH; the local Kafka broker needs Java 17 or newer. "
                "Install it (Debian/Ubuntu: 'apt-get install openjdk-17-jre-headless'), or "
                "point ENGINE_BOOTSTRAP_SERVERS at a Kafka you already run."
            )
        return java

    def _prepare_config(self, java: str, kept_port: int | None = None) -> int:
        """Write config files and format storage on first use; returns the broker port.

        Ports are kept from one run to the next, ``--fresh`` included (clients and an
        exported ENGINE_BOOTSTRAP_SERVERS keep working after a restart); a broker port that
        another program took is replaced, with a warning, since only clients know it. The
        controller port is recorded in the KRaft log by ``--standalone`` formatting, so it is
        kept as well.
        """
        config = self.data_dir / _CONFIG_FILE
        if self.node is not None:
            return self._write_config(java, self.node.broker_port, self.node.controller_port)
        old = _read_properties(config)
        broker_port = self.requested_port or self._port() or kept_port or 0
        controller_port = 0
        bootstrap = old.get("controller.quorum.bootstrap.servers", "")
        if bootstrap.rpartition(":")[2].isdigit():
            controller_port = int(bootstrap.rpartition(":")[2])
        if not broker_port or not _port_is_free(broker_port):
            if self.requested_port:
                raise LocalKafkaError(
                    f"port {broker_port} on {HOST} is in use; stop whatever holds it or "
                    f"choose another port (--port)."
                )
            previous, broker_port = broker_port, _free_port()
            if previous:
                self._progress(
                    f"warning: port {previous} is taken by another program; Kafka now listens "
                    f"on {HOST}:{broker_port} (update ENGINE_BOOTSTRAP_SERVERS, or pass --port)"
                )
        if not controller_port or not _port_is_free(controller_port):
            controller_port = _free_port()
            while controller_port == broker_port:
                controller_port = _free_port()
        return self._write_config(java, broker_port, controller_port)

    def _write_config(self, java: str, broker_port: int, controller_port: int) -> int:
        config = self.data_dir / _CONFIG_FILE
        config.write_text(
            _server_properties(
                self.data_dir, broker_port, controller_port, self.security, self.node
            ),
            encoding="utf-8",
        )
        (self.data_dir / _LOG4J_FILE).write_text(_log4j2_xml(self.log_file), encoding="utf-8")
        (self.data_dir / _PORT_FILE).write_text(f"{broker_port}\n", encoding="utf-8")
        if not (self.data_dir / _LOG_DIR / "meta.properties").is_file():
            self._format_storage(java, config)
        return broker_port

    def _format_storage(self, java: str, config: Path) -> None:
        """Format a fresh KRaft log with this node as the only voter."""
        self._progress(f"Formatting KRaft storage in {self.data_dir / _LOG_DIR}...")
        command = [
            java, "-Xmx256m", "-XX:+UseSerialGC", "-cp", f"{self.libs_dir}/*",
            "kafka.tools.StorageTool", "format", "--ignore-formatted",
            *(() if self.node else ("--standalone",)),
            "-t", self.node.cluster_id if self.node else _new_cluster_id(), "-c", str(config),
            *(self.security.format_args() if self.security else ()),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            output = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
            raise LocalKafkaError(
                f"formatting Kafka storage failed (exit {result.returncode}). Try again with "
                f"a fresh data folder: 'python -m engine dev kafka start --fresh'.\n{output}"
            )

    def _launch(self, java: str, broker_port: int) -> None:
        """Start ``kafka.Kafka`` detached, in its own session, so it outlives this process
        and a Ctrl-C in the terminal does not reach it."""
        if self.log_file.exists():
            self.log_file.replace(self.data_dir / f"{_LOG_FILE}.1")
        command = [
            java, *_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={self.data_dir / _LOG4J_FILE}",
            f"-Dkafka.logs.dir={self.data_dir}",
            "-cp", f"{self.libs_dir}/*",
            "kafka.Kafka", str(self.data_dir / _CONFIG_FILE),
        ]  # fmt: skip
        self._progress(f"Starting Kafka {self.version} on {HOST}:{broker_port}...")
        with (self.data_dir / _STDOUT_FILE).open("wb") as out:
            self._process = subprocess.Popen(
                command,
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        (self.data_dir / _PID_FILE).write_text(f"{self._process.pid}\n", encoding="utf-8")

    def _await_ready(self, broker_port: int, timeout: float) -> str:
        """Wait until the port accepts connections and the log says the server started."""
        assert self._process is not None
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            exit_code = self._process.poll()
            if exit_code is not None:
                self._clear_pid()
                raise LocalKafkaError(
                    f"Kafka exited during start-up (exit {exit_code}). If the data folder is "
                    f"damaged, start afresh with --fresh (this deletes its topics). "
                    f"{self._diagnostics()}"
                )
            if _can_connect(broker_port) and self._log_says_started():
                bootstrap = f"{HOST}:{broker_port}"
                elapsed = time.monotonic() - started
                self._progress(f"Kafka is ready at {bootstrap} after {elapsed:.1f}s.")
                return bootstrap
            time.sleep(0.1)
        raise LocalKafkaError(
            f"Kafka did not become ready within {timeout:.0f}s and was stopped. A busy machine "
            f"may need a longer --timeout. {self._diagnostics()}"
        )

    def _log_says_started(self) -> bool:
        try:
            text = self.log_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
        return any(marker in text for marker in _READY_MARKERS)

    def _diagnostics(self) -> str:
        """The tails of the broker's log and console output, for error messages."""
        parts = [f"Full log: {self.log_file}"]
        for path in (self.log_file, self.data_dir / _STDOUT_FILE):
            tail = _tail(path)
            if tail:
                parts.append(f"--- tail of {path.name} ---\n{tail}")
        return "\n".join(parts)

    # --- stop / reset -------------------------------------------------------------------

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the broker by PID: SIGTERM (clean shutdown), SIGKILL if it takes longer than
        ``timeout`` seconds. Returns whether a broker was running."""
        with self._locked():
            pid = self._pid()
            if pid is None:
                self._clear_pid()
                return False
            self._progress(f"Stopping Kafka (pid {pid})...")
            started = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not self._wait_exit(pid, timeout):
                self._progress(f"Kafka did not stop within {timeout:.0f}s; killing it.")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._wait_exit(pid, 10.0)
            self._clear_pid()
            self._progress(f"Kafka stopped after {time.monotonic() - started:.1f}s.")
            return True

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.pid == pid:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(timeout=0.1)
                    return True
            elif not self._is_our_broker(pid):
                return True
            else:
                time.sleep(0.1)
        return False

    def _clear_pid(self) -> None:
        (self.data_dir / _PID_FILE).unlink(missing_ok=True)
        if self._process is not None and self._process.poll() is not None:
            self._process = None

    def reset(self) -> None:
        """Stop the broker if it runs and delete its data folder (the jar cache stays)."""
        with self._locked():
            self.stop()
            if not self.data_dir.exists():
                return
            foreign = sorted(p.name for p in self.data_dir.iterdir() if p.name not in _OWN_ENTRIES)
            if foreign:
                raise LocalKafkaError(
                    f"refusing to delete {self.data_dir}: it holds files the broker did not "
                    f"write ({', '.join(foreign[:5])}). Point TURNSTILE_KAFKA_DIR (or "
                    f"--data-dir) at a folder of its own."
                )
            self._progress(f"Deleting {self.data_dir}.")
            shutil.rmtree(self.data_dir)
