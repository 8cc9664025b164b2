"""The dashboard's web app: a JSON API over :class:`DashboardSource` and the static page.

Reads are open to whoever can reach the port (it binds to 127.0.0.1 unless told otherwise).
Actions are refused unless the app was started with actions allowed; with a token set, an
action must also carry it in the ``X-Turnstile-Token`` header. An action answers with the
processor's outcome of its command: a refusal is a 409 whose message says why.
"""

from __future__ import annotations

import hmac
import json
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from engine.core.errors import (
    BrokerError,
    CommandRefusedError,
    CommandTimeoutError,
    ConfigurationError,
    InstanceNotFoundError,
    InvalidPageTokenError,
    TurnstileError,
)
from engine.core.history import RuntimeStatus
from engine.ui.source import DashboardSource

__all__ = ["TOKEN_HEADER", "create_app"]

TOKEN_HEADER = "X-Turnstile-Token"
_STATIC = resources.files("engine.ui") / "static"


def _status_of(error: TurnstileError) -> int:
    if isinstance(error, InstanceNotFoundError):
        return 404
    if isinstance(error, CommandRefusedError):
        return 409  # the processor refused the command: the message says why
    if isinstance(error, CommandTimeoutError):
        return 504
    if isinstance(error, ConfigurationError | InvalidPageTokenError):
        return 400
    if isinstance(error, BrokerError):
        return 503
    return 500


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class _Api:
    """The endpoints; each runs the blocking read on a worker thread."""

    def __init__(self, source: DashboardSource, allow_actions: bool, token: str | None) -> None:
        self.source = source
        self.allow_actions = allow_actions
        self.token = token

    async def _call(self, fn: Any, *args: Any) -> Response:
        try:
            return JSONResponse(await run_in_threadpool(fn, *args))
        except TurnstileError as exc:
            return _error(_status_of(exc), str(exc))

    async def config(self, request: Request) -> Response:
        return JSONResponse(
            {
                "namespace": self.source.settings.namespace,
                "actions": self.allow_actions,
                "token_required": self.token is not None,
                "statuses": [status.value for status in RuntimeStatus],
            }
        )

    async def instances(self, request: Request) -> Response:
        return await self._call(self.source.instances, dict(request.query_params))

    async def instance(self, request: Request) -> Response:
        return await self._call(self.source.instance, request.path_params["instance_id"])

    async def replicas(self, request: Request) -> Response:
        return await self._call(self.source.replicas)

    async def dead_letters(self, request: Request) -> Response:
        return await self._call(self.source.dead_letters)

    async def query(self, request: Request) -> Response:
        """A query is a read (the handler changes nothing): open like the other reads."""
        body = await _object_body(request)
        if isinstance(body, Response):
            return body
        return await self._call(self.source.query, request.path_params["instance_id"], body)

    async def update(self, request: Request) -> Response:
        """An update changes the instance: an action (allowed actions, and the token)."""
        body = await self._action_body(request)
        if isinstance(body, Response):
            return body
        return await self._call(self.source.update, request.path_params["instance_id"], body)

    async def act(self, request: Request) -> Response:
        body = await self._action_body(request)
        if isinstance(body, Response):
            return body
        action, instance_id = request.path_params["action"], request.path_params["instance_id"]
        try:
            outcome = await run_in_threadpool(self.source.act, action, instance_id, body)
        except TurnstileError as exc:
            return _error(_status_of(exc), str(exc))
        return JSONResponse(outcome.to_dict())

    async def _action_body(self, request: Request) -> dict[str, Any] | Response:
        """An action's JSON object, or the answer that refuses it (actions off, a wrong
        token, a body that is not an object)."""
        refused = self._refusal(request)
        if refused is not None:
            return refused
        return await _object_body(request)

    def _refusal(self, request: Request) -> Response | None:
        if not self.allow_actions:
            return _error(
                403,
                "actions are off: start the dashboard with --allow-actions (and --token) to "
                "raise events, update, terminate, cancel, suspend, resume or purge from it",
            )
        if self.token is not None:
            given = request.headers.get(TOKEN_HEADER, "")
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return _error(401, f"wrong or missing {TOKEN_HEADER}: enter the token first")
        return None


async def _object_body(request: Request) -> dict[str, Any] | Response:
    """The request's JSON object, or the 400 that says what to send instead."""
    try:
        body = await request.json() if await request.body() else {}
    except json.JSONDecodeError:
        return _error(400, "the request body is not JSON; send a JSON object")
    if not isinstance(body, dict):
        return _error(400, "the request body must be a JSON object")
    return body


async def _index(request: Request) -> Response:
    return FileResponse(str(_STATIC / "index.html"))


def create_app(
    source: DashboardSource, *, allow_actions: bool = False, token: str | None = None
) -> Starlette:
    """The ASGI app; the caller owns ``source`` and closes it after the server stops."""
    api = _Api(source, allow_actions, token or None)
    routes = [
        Route("/", _index),
        Route("/api/config", api.config),
        Route("/api/instances", api.instances),
        Route("/api/instances/{instance_id:path}/actions/{action}", api.act, methods=["POST"]),
        Route("/api/instances/{instance_id:path}/query", api.query, methods=["POST"]),
        Route("/api/instances/{instance_id:path}/update", api.update, methods=["POST"]),
        Route("/api/instances/{instance_id:path}", api.instance),
        Route("/api/replicas", api.replicas),
        Route("/api/dead-letters", api.dead_letters),
        Mount("/static", app=StaticFiles(directory=str(_STATIC)), name="static"),
    ]
    return Starlette(routes=routes)
