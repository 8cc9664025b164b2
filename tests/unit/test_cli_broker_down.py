"""Commands against a broker that is not there: each fails on its own (within its connect
timeout, enforced here only by a generous safety limit), exits 69, says once and in the
engine's words what is wrong and what to do, and prints no raw librdkafka line and no
traceback. Also: bad input on the command line is a message, never a traceback.

No broker is needed: the addresses are a closed local port, a host that cannot resolve,
and a local server that accepts connections but is not Kafka.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

RAW_LIBRDKAFKA = re.compile(r"^%\d\|\d+\.\d+\|", re.MULTILINE)
SAFETY_LIMIT_S = 120
EXIT_UNREACHABLE = 69


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers, like a port of some other service."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


def _turnstile(*args: str, bootstrap: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNSTILE_", "ENGINE_"))}
    if bootstrap is not None:
        env["ENGINE_BOOTSTRAP_SERVERS"] = bootstrap
    return subprocess.run(
        [sys.executable, "-m", "engine", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=SAFETY_LIMIT_S,
        check=False,
    )


def _assert_one_clear_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    output = result.stdout + result.stderr
    assert not RAW_LIBRDKAFKA.search(output), output
    assert "Traceback" not in output, output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for word in words:
        assert word in errors[0], errors[0]


COMMANDS = [
    ("topics", "apply"),
    ("topics", "check"),
    ("start", "shop.checkout", "--input", "{}"),
    ("raise", "o-1", "approval"),
    ("status", "o-1"),
    ("wait", "o-1", "--timeout", "30"),
    ("list",),
    ("history", "show", "o-1"),
    ("audit", "state"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_refused_connection(command: tuple[str, ...]) -> None:
    address = _closed_port()
    result = _turnstile(*command, "--connect-timeout", "1", bootstrap=address)
    assert result.returncode == EXIT_UNREACHABLE, result.stderr
    _assert_one_clear_error(result, address, "connection refused", "dev kafka start")


def test_wait_gives_up_within_its_own_timeout_when_it_is_shorter() -> None:
    address = _closed_port()
    result = _turnstile("wait", "o-1", "--timeout", "1", bootstrap=address)
    assert result.returncode == EXIT_UNREACHABLE
    _assert_one_clear_error(result, address)


def test_unresolvable_host() -> None:
    result = _turnstile(
        "status", "o-1", "--connect-timeout", "1", bootstrap="no-such-host.invalid:9092"
    )
    assert result.returncode == EXIT_UNREACHABLE
    _assert_one_clear_error(result, "cannot resolve", "no-such-host.invalid")


def test_a_port_that_is_not_kafka(silent_server: str) -> None:
    result = _turnstile("status", "o-1", "--connect-timeout", "1", bootstrap=silent_server)
    assert result.returncode == EXIT_UNREACHABLE
    _assert_one_clear_error(result, silent_server, "--connect-timeout")


def test_a_processor_does_not_start_without_kafka() -> None:
    address = _closed_port()
    result = _turnstile(
        "run",
        "processor",
        "--module",
        "engine.examples.orders",
        "--connect-timeout",
        "1",
        "--state-dir",
        os.devnull,
        bootstrap=address,
    )
    assert result.returncode == EXIT_UNREACHABLE
    _assert_one_clear_error(result, address, "connection refused")


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (("topics", "check", "--partitions", "0"), {}, ["partitions must be at least 1"]),
        (("status", "x"), {"ENGINE_BOOTSTRAP_SERVERS": "http://localhost:9092"}, ["web URL"]),
        (("status", "x"), {"TURNSTILE_NAMESPAC": "x"}, ["TURNSTILE_NAMESPACE"]),
        (("status", "x", "--kafka", "nonsense"), {}, ["KEY=VALUE"]),
        (("run", "worker", "--log-level", "verbose"), {}, ["invalid choice"]),
        (("status", "x", "--connect-timeout", "-1"), {}, ["more than 0"]),
        (("start", "w", "--input", "{nope"), {}, ["not valid JSON"]),
        (("list", "--limit", "-3"), {}, ["must be at least 1"]),
        (("wait", "x", "--timeout", "-5"), {}, ["must not be negative"]),
    ],
)
def test_bad_input_is_a_message_not_a_traceback(
    args: tuple[str, ...], env: dict[str, str], words: list[str]
) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TURNSTILE_", "ENGINE_"))}
    result = subprocess.run(
        [sys.executable, "-m", "engine", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=SAFETY_LIMIT_S,
        check=False,
    )
    assert result.returncode in (1, 2), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--queue-rate", "gpu=fast", ["--queue-rate 'gpu=fast'", "QUEUE=N"]),
        ("--queue-concurrency", "gpu=2.5", ["--queue-concurrency 'gpu=2.5'", "a whole number"]),
    ],
)
def test_a_worker_with_a_bad_queue_limit_says_so_before_it_connects(
    flag: str, value: str, words: list[str]
) -> None:
    """No broker at the address: the limit's error comes first, not the connection's."""
    result = _turnstile(
        "run", "worker", "--module", "engine.examples.orders", flag, value,
        "--connect-timeout", "1", bootstrap=_closed_port(),
    )  # fmt: skip
    assert result.returncode in (1, 2), result.stderr
    _assert_one_clear_error(result, *words)


def test_version_flag() -> None:
    import engine

    result = _turnstile("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"turnstile {engine.__version__}"
