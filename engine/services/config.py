"""Settings shared by every engine process, from defaults, a TOML file, the environment and
flags (later sources win).

One dataclass for all processes keeps names consistent: the same ``namespace`` picks the
same topics whether a processor, a worker or a client reads it.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from engine.core.errors import ConfigurationError
from engine.core.limits import Limits

ENV_PREFIX = "TURNSTILE_"


@dataclass(frozen=True)
class Settings:
    bootstrap_servers: str = "127.0.0.1:9092"
    namespace: str = "turnstile"
    #: Partition count of every co-partitioned topic; fixed once topics exist.
    partitions: int = 32
    replication_factor: int = 1
    #: Where processor replicas keep their RocksDB tables.
    state_dir: str = field(default_factory=lambda: str(Path.home() / ".cache/turnstile/state"))
    #: Stable per replica: it names the replica's transactional.id across restarts.
    replica_id: str = "processor-0"
    #: Turn batching: commit after this many records or this long, whichever comes first.
    max_batch: int = 500
    max_batch_ms: int = 100
    #: Events raised for instances that do not exist yet are kept within these bounds.
    pending_events_max: int = 1000
    pending_events_ttl_ms: int = 24 * 3600 * 1000
    #: Hot instances kept in memory per replica.
    cache_instances: int = 10000
    worker_concurrency: int = 16
    worker_id: str = "worker-0"
    modules: tuple[str, ...] = ()
    #: Size limits (bytes) of the values a workflow moves; see engine.core.limits.
    max_workflow_input_bytes: int = 256 * 1024
    max_workflow_output_bytes: int = 256 * 1024
    max_activity_input_bytes: int = 256 * 1024
    max_activity_result_bytes: int = 256 * 1024
    max_event_bytes: int = 256 * 1024
    max_custom_status_bytes: int = 64 * 1024
    #: Largest record the engine writes; ``topics apply`` sets max.message.bytes from it.
    max_record_bytes: int = 1_000_000
    #: CPU time one turn of one instance may take before the watchdog fails it.
    turn_budget_ms: int = 5000
    #: History events one turn may add (bounds the memory of a runaway turn).
    turn_max_events: int = 100_000
    extra_kafka: dict[str, str] = field(default_factory=dict)

    @property
    def limits(self) -> Limits:
        """The size limits, checked together (each must fit in one record)."""
        try:
            return Limits(
                workflow_input=self.max_workflow_input_bytes,
                workflow_output=self.max_workflow_output_bytes,
                activity_input=self.max_activity_input_bytes,
                activity_result=self.max_activity_result_bytes,
                event=self.max_event_bytes,
                custom_status=self.max_custom_status_bytes,
                record=self.max_record_bytes,
            )
        except ValueError as exc:
            raise ConfigurationError(f"size limits: {exc}") from exc

    @property
    def processor_group(self) -> str:
        return f"{self.namespace}.processor"

    @property
    def worker_group(self) -> str:
        return f"{self.namespace}.worker"


_ENV_ALIASES = {"ENGINE_BOOTSTRAP_SERVERS": "bootstrap_servers"}


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    **overrides: Any,
) -> Settings:
    """Build settings: defaults < TOML file < environment < explicit overrides (flags).

    The TOML file may hold the keys at top level or under ``[turnstile]``. Environment
    variables are ``TURNSTILE_<FIELD>`` in upper case (``ENGINE_BOOTSTRAP_SERVERS`` is also
    honoured for the bootstrap servers).
    """
    env = dict(os.environ) if env is None else env
    values: dict[str, Any] = {}
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        values.update(_from_toml(Path(path)))
    values.update(_from_env(env))
    values.update({k: v for k, v in overrides.items() if v is not None})
    return _coerce(replace(Settings()), values)


def _from_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigurationError(f"config file {path} does not exist; check --config") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"config file {path} is not valid TOML: {exc}") from exc
    section = data.get("turnstile", data)
    if not isinstance(section, dict):
        raise ConfigurationError(f"config file {path}: [turnstile] must be a table")
    return dict(section)


def _from_env(env: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for alias, name in _ENV_ALIASES.items():
        if alias in env:
            out[name] = env[alias]
    for f in fields(Settings):
        key = ENV_PREFIX + f.name.upper()
        if key in env:
            out[f.name] = env[key]
    return out


def _coerce(base: Settings, values: dict[str, Any]) -> Settings:
    known = {f.name: f for f in fields(Settings)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigurationError(
            f"unknown setting(s) {', '.join(unknown)}; known settings are "
            f"{', '.join(sorted(known))}"
        )
    converted: dict[str, Any] = {}
    for name, raw in values.items():
        current = getattr(base, name)
        converted[name] = _convert(name, raw, current)
    return replace(base, **converted)


def _convert(name: str, raw: Any, current: Any) -> Any:
    try:
        if isinstance(current, bool):
            return raw if isinstance(raw, bool) else str(raw).lower() in {"1", "true", "yes"}
        if isinstance(current, int):
            return int(raw)
        if isinstance(current, tuple):
            if isinstance(raw, str):
                return tuple(p.strip() for p in raw.split(",") if p.strip())
            return tuple(raw)
        if isinstance(current, dict):
            if isinstance(raw, str):
                pairs = (p.split("=", 1) for p in raw.split(",") if "=" in p)
                return {k.strip(): v.strip() for k, v in pairs}
            return {str(k): str(v) for k, v in dict(raw).items()}
        return str(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"setting {name}={raw!r} is not valid: {exc}") from exc
