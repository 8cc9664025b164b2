"""Where the engine's wire contracts live: the Avro schemas and the topics spec.

In a source checkout they are the top-level ``schemas/`` and ``topics/`` folders, the public
contract that producers in other languages read. A built wheel carries copies of both inside
the package (``engine/_contracts/``, mapped in ``pyproject.toml``), because an installed
engine has no source tree around it. The shipped copy wins when both exist, so an installed
engine never picks up a folder that merely happens to sit two levels above it.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from engine.core.errors import ConfigurationError

__all__ = ["SCHEMAS", "TOPICS", "contract_dir"]

SCHEMAS = "schemas"
TOPICS = "topics"
_SHIPPED = "_contracts"


def contract_dir(kind: str) -> Path:
    """The folder holding the ``schemas`` or ``topics`` contract of this installation."""
    if kind not in (SCHEMAS, TOPICS):
        raise ValueError(f"unknown contract folder {kind!r}")
    package = importlib.resources.files("engine")
    shipped = Path(str(package)) / _SHIPPED / kind
    if shipped.is_dir():
        return shipped
    checkout = Path(__file__).resolve().parents[2] / kind
    if checkout.is_dir():
        return checkout
    raise ConfigurationError(
        f"the engine's {kind} folder is not installed (looked in {shipped} and {checkout}); "
        f"reinstall the package (pip install --force-reinstall turnstile-engine)"
    )
