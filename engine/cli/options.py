"""Flags every command that talks to the engine shares: where the settings come from.

Settings are layered defaults < TOML file < environment (``TURNSTILE_*``) < these flags, so
a flag left out falls back to the environment or the config file.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from engine.core.errors import ConfigurationError
from engine.services.config import Settings, load_settings

__all__ = [
    "add_metrics_arguments",
    "add_module_arguments",
    "add_settings_arguments",
    "require_registered",
    "settings_from_args",
]


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


def settings_from_args(args: argparse.Namespace, **overrides: Any) -> Settings:
    """The settings for this invocation (flags win over environment and config file)."""
    return load_settings(
        getattr(args, "config", None),
        bootstrap_servers=getattr(args, "bootstrap_servers", None),
        namespace=getattr(args, "namespace", None),
        **overrides,
    )


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
