"""librdkafka's own log lines and connection errors, in Python logging and the engine's words.

Left alone, librdkafka prints every log line it has straight to stderr (``%3|...|FAIL|...``
hundreds of times a minute while a broker is down, and ``%4``/``%6`` lines even on healthy
runs). Every client config from :mod:`engine.adapters.kafka.config` therefore carries:

- ``logger``: the lines go to the Python logger ``engine.kafka.librdkafka``, which is silent
  unless :func:`show_librdkafka_logs` (the CLI's ``--verbose``) turns it on;
- ``error_cb``: a :class:`ConnectionWatch` that remembers the last connection error (so a
  command that gives up can say why) and, for a client that has been running for a while,
  logs a lost connection once per address and kind of failure per minute, with the next
  step, on the ``engine.kafka`` logger.

This module imports no Kafka client: it only calls the methods of the errors it is given.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

__all__ = [
    "LIBRDKAFKA_LOGGER",
    "ConnectionWatch",
    "explain_connection_error",
    "show_librdkafka_logs",
    "unreachable_message",
]

LIBRDKAFKA_LOGGER = "engine.kafka.librdkafka"
_librdkafka = logging.getLogger(LIBRDKAFKA_LOGGER)
_librdkafka.addHandler(logging.NullHandler())
_librdkafka.propagate = False
log = logging.getLogger("engine.kafka")

#: librdkafka's "local" error names that mean the broker cannot be reached or talked to.
CONNECTION_ERRORS = frozenset(
    {"_TRANSPORT", "_RESOLVE", "_ALL_BROKERS_DOWN", "_SSL", "_AUTHENTICATION", "_TIMED_OUT"}
)
#: Within this long after a client is created, its own caller reports a failure (a command
#: that gives up, a client constructor that raises); only later losses are logged here.
STARTUP_GRACE_S = 10.0
REPEAT_AFTER_S = 60.0

_reported: dict[tuple[str, str], float] = {}
_reported_lock = threading.Lock()


class KafkaErrorLike(Protocol):
    """What ``confluent_kafka.KafkaError`` offers that we use."""

    def name(self) -> str: ...

    def str(self) -> str: ...

    def fatal(self) -> bool: ...


def show_librdkafka_logs(level: int = logging.WARNING) -> None:
    """Let librdkafka's log lines through to the root logger from ``level`` up."""
    _librdkafka.setLevel(level)
    _librdkafka.propagate = True


def explain_connection_error(bootstrap_servers: str, detail: str) -> str:
    """One sentence about why Kafka at ``bootstrap_servers`` cannot be used, and what to do."""
    lowered = detail.lower()
    if "resolve" in lowered:
        return (
            f"cannot resolve the Kafka host in {bootstrap_servers!r}; check the host name "
            f"(--bootstrap-servers or ENGINE_BOOTSTRAP_SERVERS)"
        )
    if "connection refused" in lowered:
        return (
            f"nothing accepts connections at {bootstrap_servers} (connection refused); start "
            f"Kafka there (for a local one: python -m engine dev kafka start) or point "
            f"--bootstrap-servers / ENGINE_BOOTSTRAP_SERVERS at a running broker"
        )
    if "apiversion" in lowered or "broker version" in lowered or "disconnected" in lowered:
        return (
            f"something at {bootstrap_servers} answered but not as a Kafka broker (or it expects "
            f"TLS/SASL); check the port, and for a secured cluster set security.protocol and "
            f"the sasl.*/ssl.* settings (docs/how-to/security-and-clusters.md)"
        )
    # before the TLS test: a SASL_SSL failure names "sasl_ssl://" whatever went wrong
    if "authentic" in lowered:
        return (
            f"Kafka at {bootstrap_servers} refused the credentials ({detail}); check the "
            f"sasl.* settings"
        )
    if "ssl" in lowered or "certificate" in lowered:
        return (
            f"the TLS handshake with Kafka at {bootstrap_servers} failed ({detail}); check the "
            f"ssl.* settings"
        )
    if "sasl" in lowered:
        return (
            f"Kafka at {bootstrap_servers} refused the credentials ({detail}); check the "
            f"sasl.* settings"
        )
    return (
        f"cannot talk to Kafka at {bootstrap_servers} ({detail}); check that it runs, and for "
        f"a secured cluster (a listener that closes plaintext connections at once) set "
        f"security.protocol and the sasl.*/ssl.* settings"
    )


def unreachable_message(bootstrap_servers: str, detail: str | None, timeout_s: float) -> str:
    """Why a command gave up on Kafka after ``timeout_s``."""
    if detail is None:
        return (
            f"no answer from Kafka at {bootstrap_servers} within {timeout_s:g}s; check that it "
            f"runs and is reachable from here (--connect-timeout to wait longer)"
        )
    return explain_connection_error(bootstrap_servers, detail)


class ConnectionWatch:
    """The ``error_cb`` of one client: remembers and, past start-up, reports connection loss."""

    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.created = time.monotonic()
        #: The most useful connection error seen (a specific one beats "all brokers down").
        self.last: str | None = None

    def __call__(self, error: KafkaErrorLike) -> None:
        name = error.name()
        if name not in CONNECTION_ERRORS:
            level = logging.ERROR if error.fatal() else logging.WARNING
            log.log(level, "Kafka client error at %s: %s", self.bootstrap_servers, error.str())
            return
        if name != "_ALL_BROKERS_DOWN" or self.last is None:
            self.last = error.str()
        if time.monotonic() - self.created >= STARTUP_GRACE_S:
            self._report(name)

    def _report(self, name: str) -> None:
        key = (self.bootstrap_servers, name)
        now = time.monotonic()
        with _reported_lock:
            if now - _reported.get(key, -REPEAT_AFTER_S) < REPEAT_AFTER_S:
                return
            _reported[key] = now
        detail = self.last or name
        log.warning(
            "%s; retrying (said once a minute)",
            explain_connection_error(self.bootstrap_servers, detail),
        )


def logging_config(bootstrap_servers: str) -> dict[str, Any]:
    """The ``logger`` and ``error_cb`` entries of a client config."""
    return {"logger": _librdkafka, "error_cb": ConnectionWatch(bootstrap_servers)}


def watch_of(config: dict[str, Any]) -> ConnectionWatch | None:
    """The :class:`ConnectionWatch` a config built here carries, if any."""
    watch = config.get("error_cb")
    return watch if isinstance(watch, ConnectionWatch) else None
