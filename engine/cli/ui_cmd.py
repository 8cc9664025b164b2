"""``ui``: the web dashboard (instances, timelines, replicas and lag, dead letters, actions).

Bound to 127.0.0.1 unless ``--host`` says otherwise; read-only unless ``--allow-actions``.
"""

from __future__ import annotations

import argparse
import logging
import os

from engine.cli import SubParsers
from engine.cli.options import add_settings_arguments, settings_from_args
from engine.core.errors import ConfigurationError

__all__ = ["register"]

log = logging.getLogger("engine.ui")


def register(subparsers: SubParsers) -> None:
    """Add ``ui``."""
    ui = subparsers.add_parser(
        "ui",
        help="serve the web dashboard",
        description="A web dashboard on http://127.0.0.1:8080: instances with filters, each "
        "instance's state and timeline, replicas with their partitions and lag, dead letters. "
        "Read-only unless --allow-actions (then raise event, terminate, suspend, resume, "
        "purge, confirmed in the page). Needs the 'ui' extra.",
    )
    add_settings_arguments(ui)
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    ui.add_argument("--port", type=int, default=8080, help="port to serve on (8080)")
    ui.add_argument(
        "--allow-actions",
        action="store_true",
        help="let the page send commands (raise event, terminate, suspend, resume, purge)",
    )
    ui.add_argument(
        "--token",
        default=os.environ.get("TURNSTILE_UI_TOKEN"),
        help="with --allow-actions, actions must carry this token (default: "
        "$TURNSTILE_UI_TOKEN); set one whenever others can reach the port",
    )
    ui.set_defaults(handler=_run_ui)


def _run_ui(args: argparse.Namespace) -> int:
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from engine.ui.server import DashboardServer
        from engine.ui.source import DashboardSource
    except ImportError as exc:
        raise ConfigurationError(
            f"the dashboard needs the 'ui' extra ({exc.name} is missing): "
            f"pip install 'turnstile-engine[ui]'"
        ) from exc
    if args.host not in ("127.0.0.1", "localhost", "::1") and args.allow_actions and not args.token:
        raise ConfigurationError(
            f"--allow-actions on {args.host} would let anyone who reaches the port send "
            f"commands: set --token (or $TURNSTILE_UI_TOKEN) too"
        )
    settings = settings_from_args(args)
    server = DashboardServer(
        DashboardSource(settings),
        host=args.host,
        port=args.port,
        allow_actions=args.allow_actions,
        token=args.token,
    )
    log.info(
        "dashboard for namespace %s on %s (actions %s)",
        settings.namespace,
        server.url,
        "on" if args.allow_actions else "off",
    )
    server.run()
    return 0
