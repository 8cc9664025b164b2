"""Layering: ``import engine`` stays pure, and the pure core imports only the stdlib.

Workflow code imports ``engine``; it must be importable where there is no Kafka, RocksDB or
Avro (an auditor's notebook, a unit test), and the deterministic runtime must not reach for
I/O. The AST walk catches a forbidden import even in a module nobody imports yet.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PURE = ("engine/core", "engine/runtime")
ALLOWED_PREFIXES = ("engine.core", "engine.runtime")


def test_import_engine_pulls_in_no_kafka_rocksdb_avro_or_asyncio() -> None:
    code = (
        "import json, sys, engine; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in {'confluent_kafka', 'rocksdict', 'fastavro', 'asyncio', "
        "'socket', 'prometheus_client', 'opentelemetry', 'starlette', 'uvicorn', 'faust', "
        "'aiokafka', 'engine'})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = json.loads(out.stdout)
    assert not [m for m in loaded if not m.startswith("engine")], loaded
    assert all(m == "engine" or m.startswith(ALLOWED_PREFIXES) for m in loaded), loaded


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return found


def test_the_pure_core_imports_only_the_stdlib_and_itself() -> None:
    stdlib = sys.stdlib_module_names
    offenders = []
    files = [p for folder in PURE for p in sorted((ROOT / folder).rglob("*.py"))]
    assert files
    for path in files:
        for line, module in _imports(path):
            top = module.split(".")[0]
            if top in stdlib or top == "__future__" or module.startswith(ALLOWED_PREFIXES):
                continue
            offenders.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not offenders, "\n".join(offenders)


def test_the_public_api_is_exported() -> None:
    import engine

    for name in ("workflow", "activity", "Registry", "WorkflowContext", "RetryPolicy"):
        assert name in engine.__all__ and hasattr(engine, name)
    for name in engine.__all__:
        assert getattr(engine, name) is not None


def test_the_test_kit_runs_without_kafka_or_rocksdb() -> None:
    """Users import engine.testing where there is no broker and no RocksDB."""
    code = (
        "import json, sys, engine.testing; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in {'confluent_kafka', 'rocksdict'} "
        "or m.startswith(('engine.adapters', 'engine.cli', 'engine.dev')))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []
