"""A Confluent Schema Registry REST API, faked at the HTTP layer for the tests.

No registry server can be installed from the package registries this project uses: the
Confluent server is not on Maven Central, Karapace is not on PyPI, and Apicurio Registry's
artifact there is its application classes before the Quarkus build step (no runnable jar,
built for Java 21). So the tests speak real HTTP to this small server instead: the calls
the engine and confluent_kafka's ``SchemaRegistryClient`` make (register, look up by id,
list subjects), with the registry's behaviour that matters here: one id per distinct schema across
subjects, versions per subject, JSON error bodies, and a subject that refuses schemas
(as an incompatible one is refused) when told to.
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class FakeRegistry:
    """The registry's state: schemas by id, and each subject's versions (schema ids)."""

    def __init__(self) -> None:
        # ids start at a random base so ids of two registries in one test run never agree
        self.next_id = random.randrange(1000, 1_000_000)
        self.schemas: dict[int, str] = {}
        self.subjects: dict[str, list[int]] = {}
        self.refused_subjects: set[str] = set()
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def register(self, subject: str, schema: str) -> tuple[int, dict[str, Any]]:
        if subject in self.refused_subjects:
            return 409, {
                "error_code": 409,
                "message": f"Schema being registered is incompatible with an earlier schema "
                f"for subject {subject!r}",
            }
        canonical = json.dumps(json.loads(schema), sort_keys=True)
        with self.lock:
            found = [i for i, s in self.schemas.items() if s == canonical]
            schema_id = found[0] if found else self.next_id
            if not found:
                self.schemas[schema_id] = canonical
                self.next_id += 1
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
        return 200, {"id": schema_id}

    def lookup(self, subject: str, schema: str) -> tuple[int, dict[str, Any]]:
        canonical = json.dumps(json.loads(schema), sort_keys=True)
        for version, schema_id in enumerate(self.subjects.get(subject, []), start=1):
            if self.schemas[schema_id] == canonical:
                return 200, _version(subject, version, schema_id, canonical)
        return 404, {"error_code": 40403, "message": "Schema not found"}

    def by_id(self, schema_id: int) -> tuple[int, dict[str, Any]]:
        if schema_id not in self.schemas:
            return 404, {"error_code": 40403, "message": f"Schema {schema_id} not found"}
        return 200, {"schema": self.schemas[schema_id]}

    def latest(self, subject: str) -> tuple[int, dict[str, Any]]:
        versions = self.subjects.get(subject)
        if not versions:
            return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
        return 200, _version(subject, len(versions), versions[-1], self.schemas[versions[-1]])


def _version(subject: str, version: int, schema_id: int, schema: str) -> dict[str, Any]:
    return {"subject": subject, "version": version, "id": schema_id, "schema": schema}


_ROUTES = [
    ("POST", re.compile(r"^/subjects/([^/]+)/versions$"), "register"),
    ("POST", re.compile(r"^/subjects/([^/]+)$"), "lookup"),
    ("GET", re.compile(r"^/schemas/ids/(\d+)$"), "by_id"),
    ("GET", re.compile(r"^/subjects/([^/]+)/versions/latest$"), "latest"),
]


def _handler(registry: FakeRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

        def _answer(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            path = urlsplit(self.path).path
            registry.requests.append((method, path))
            if method == "GET" and path == "/subjects":
                self._answer(200, sorted(registry.subjects))
                return
            for verb, pattern, name in _ROUTES:
                match = pattern.match(path)
                if verb == method and match:
                    arg = unquote(match.group(1))
                    if method == "POST":
                        length = int(self.headers.get("Content-Length", "0"))
                        schema = json.loads(self.rfile.read(length))["schema"]
                        self._answer(*getattr(registry, name)(arg, schema))
                    else:
                        value = int(arg) if name == "by_id" else arg
                        self._answer(*getattr(registry, name)(value))
                    return
            self._answer(404, {"error_code": 404, "message": f"no route {method} {path}"})

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

    return Handler


@contextmanager
def fake_schema_registry() -> Iterator[tuple[str, FakeRegistry]]:
    """A registry on 127.0.0.1 (a free port) for the block: its URL and its state."""
    registry = FakeRegistry()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(registry))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", registry
    finally:
        server.shutdown()
        server.server_close()
