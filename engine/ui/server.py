"""Serve the dashboard with uvicorn, in the foreground (the CLI) or on a thread (tests)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from engine.core.errors import ConfigurationError
from engine.ui.app import create_app
from engine.ui.source import DashboardSource

__all__ = ["DashboardServer"]

_START_TIMEOUT_S = 30.0


class DashboardServer:
    """One uvicorn server for one :class:`DashboardSource` (closed when the server stops)."""

    def __init__(
        self,
        source: DashboardSource,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        allow_actions: bool = False,
        token: str | None = None,
    ) -> None:
        if port == 0:
            port = _free_port(host)
        self.source = source
        self.host = host
        self.port = port
        app = create_app(source, allow_actions=allow_actions, token=token)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM (uvicorn's own handlers), then close the source."""
        try:
            self._server.run()
        finally:
            self.source.close()

    def start(self) -> DashboardServer:
        """Serve on a background thread; returns once the port accepts connections."""
        self._thread = threading.Thread(target=self._server.run, name="dashboard", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ConfigurationError(
                    f"the dashboard did not start on {self.url}; is the port already in use?"
                )
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        self.source.close()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
