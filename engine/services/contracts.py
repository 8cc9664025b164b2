"""Start-up check of the wire contracts a process needs: every Avro schema (current and
released) and the topics spec.

The codec loads its schemas on first use; a processor whose schemas are missing would only
notice at its first record, after it had joined its group and reported healthy partitions.
Processes call :func:`check_contracts` before they connect, so such an installation stops at
once with the reason.
"""

from __future__ import annotations

from engine.codec import known_schemas
from engine.config.topics import load_spec

__all__ = ["check_contracts"]


def check_contracts() -> str:
    """Load and compile every schema and read the topics spec; a one-line summary.

    Raises CodecError or ConfigurationError naming the missing or broken file.
    """
    schemas = known_schemas()
    spec = load_spec()
    versions = sorted({s.version for s in schemas})
    return (
        f"{len(schemas)} Avro schemas (versions {', '.join(versions)}) and "
        f"{len(spec.topics)} topics from {spec.source}"
    )
