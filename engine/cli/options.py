"""Flags every command that talks to the engine shares: where the settings come from.

Settings are layered defaults < TOML file < environment (``TURNSTILE_*``) < these flags, so
a flag left out falls back to the environment or the config file.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from engine.adapters.kafka.payloads import payload_store
from engine.cli import SubParsers
from engine.cli.log_format import LOG_FORMATS, formatter
from engine.config.payloads import install_payload_codecs
from engine.config.settings import Settings, load_settings, parse_kafka_pair
from engine.core.errors import ConfigurationError

__all__ = [
    "add_log_level_argument",
    "add_metrics_arguments",
    "add_module_arguments",
    "add_settings_arguments",
    "configure_logging",
    "connected_settings",
    "require_registered",
    "settings_from_args",
]


def _kafka_pair(text: str) -> tuple[str, str]:
    try:
        return parse_kafka_pair(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc}, e.g. --kafka security.protocol=SASL_SSL"
        ) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return value


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config``, ``--bootstrap-servers`` and ``--namespace`` to ``parser``."""
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--config", metavar="FILE", help="TOML settings file (default: $TURNSTILE_CONFIG)"
    )
    group.add_argument(
        "--bootstrap-servers",
        metavar="HOST:PORT",
        help="Kafka brokers (default: $TURNSTILE_BOOTSTRAP_SERVERS, $ENGINE_BOOTSTRAP_SERVERS "
        "or 127.0.0.1:9092)",
    )
    group.add_argument(
        "--namespace",
        help="prefix of the engine's topics and groups (default: $TURNSTILE_NAMESPACE or "
        "turnstile)",
    )
    group.add_argument(
        "--kafka",
        type=_kafka_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka setting for every Kafka client, e.g. security.protocol=SASL_SSL "
        "(repeatable; wins over [kafka] in the config file and $TURNSTILE_EXTRA_KAFKA)",
    )
    group.add_argument(
        "--connect-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="give up when Kafka does not answer within this long (default: "
        "$TURNSTILE_CONNECT_TIMEOUT_MS / 1000 or 5)",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="also show the Kafka client's own warnings (librdkafka)",
    )


def settings_from_args(args: argparse.Namespace, **overrides: Any) -> Settings:
    """The settings for this invocation (flags win over environment and config file)."""
    timeout = getattr(args, "connect_timeout", None)
    settings = load_settings(
        getattr(args, "config", None),
        kafka=dict(getattr(args, "kafka", None) or ()),
        bootstrap_servers=getattr(args, "bootstrap_servers", None),
        namespace=getattr(args, "namespace", None),
        connect_timeout_ms=None if timeout is None else max(1, round(timeout * 1000)),
        **overrides,
    )
    install_payload_codecs(settings)  # every command writes or reads payloads the same way
    payload_store(settings)  # ... and reads large ones from the payloads topic
    return settings


def connected_settings(
    args: argparse.Namespace, *, within_s: float | None = None, **overrides: Any
) -> Settings:
    """The settings, once Kafka has answered at their address: a command against a broker
    that is down fails here, within the connect timeout (or ``within_s`` if shorter), with
    one message saying why and what to do."""
    from engine.adapters.kafka.admin import ensure_reachable

    settings = settings_from_args(args, **overrides)
    timeout = settings.connect_timeout_s
    ensure_reachable(settings, timeout if within_s is None else min(timeout, within_s))
    return settings


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    """``--log-level``: the engine's own log lines (librdkafka's need ``--verbose``)."""
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default="INFO",
        help="logging level of the engine's messages (INFO)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text lines for people (default) or one JSON object per line for machines",
    )


def configure_logging(args: argparse.Namespace) -> None:
    """Log lines at ``--log-level`` on stderr, as text (with the instance id and
    generation of lines about an instance) or JSON (``--log-format``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(getattr(args, "log_format", "text")))
    logging.basicConfig(level=args.log_level, handlers=[handler])


def add_module_arguments(parser: argparse.ArgumentParser, registers: str) -> None:
    """``-m/--module``: user modules to import so that their decorators register
    ``registers`` (workflows, activities)."""
    parser.add_argument(
        "-m",
        "--module",
        dest="modules",
        action="append",
        default=[],
        metavar="MODULE",
        help=f"import this module to register its {registers} (repeatable; also "
        f"$TURNSTILE_MODULES, comma-separated)",
    )


def require_registered(names: Sequence[object], kind: str) -> None:
    """Refuse to run a process that has nothing to run: the usual cause is a missing
    ``--module``."""
    if not names:
        raise ConfigurationError(
            f"no {kind} are registered; pass the module(s) that define them with --module "
            f"(for example --module myapp.{kind})"
        )


def add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--metrics-host``: serve Prometheus metrics, /healthz and
    /readyz from this process."""
    group = parser.add_argument_group("metrics")
    group.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on /metrics, and /healthz and /readyz, on this port "
        "(default: no metrics endpoint)",
    )
    group.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="address the metrics endpoint binds to (127.0.0.1; 0.0.0.0 for a scraper on "
        "another host)",
    )


def add_command(
    subparsers: SubParsers, name: str, help: str, handler: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """A command with the settings options, run by ``handler``."""
    parser = subparsers.add_parser(name, help=help, description=help)
    add_settings_arguments(parser)
    parser.set_defaults(handler=handler)
    return parser


# --- argument types shared by the commands --------------------------------------------------


def json_value(text: str) -> Any:
    """A ``--input`` / ``--data`` option's JSON value."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"not valid JSON ({exc}); quote strings, e.g. --input '\"hello\"'"
        ) from exc


def iso_time(text: str) -> datetime:
    """An ISO 8601 time option; without a zone it is UTC (never the machine's local time)."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time ({exc}), e.g. 2030-01-31T09:00:00+00:00"
        ) from exc
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def add_tag_filter(parser: argparse.ArgumentParser) -> None:
    """``--tag KEY=VALUE`` (repeatable) for commands that pick instances by their tags."""
    parser.add_argument(
        "--tag",
        type=tag_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only instances with this tag (repeatable: all of them)",
    )


def tag_pair(text: str) -> tuple[str, str]:
    """A ``--tag KEY=VALUE`` option's value (start, list and bulk filters)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"tags are KEY=VALUE, got {text!r}")
    return key, value
