"""Settings shared by every engine process, from defaults, a TOML file, the environment and
flags (later sources win).

One dataclass for all processes keeps names consistent: the same ``namespace`` picks the
same topics whether a processor, a worker or a client reads it. Every source is checked the
same way: an unknown key (a TOML typo, a ``TURNSTILE_*`` variable that names nothing) is an
error with a suggestion, and every value is validated before a process uses it, because a
typo that is silently ignored runs the engine with a setting nobody chose.
"""

from __future__ import annotations

import difflib
import json
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from engine.config.triggers import Trigger, parse_triggers
from engine.core.errors import ConfigurationError
from engine.core.limits import HistoryLimits, Limits
from engine.core.payload_refs import DEFAULT_INLINE_MAX, DEFAULT_PAYLOAD_MAX

ENV_PREFIX = "TURNSTILE_"

#: The values of the ``group_protocol`` setting (Kafka's ``group.protocol``).
CLASSIC_GROUP_PROTOCOL = "classic"
CONSUMER_GROUP_PROTOCOL = "consumer"
GROUP_PROTOCOLS = (CLASSIC_GROUP_PROTOCOL, CONSUMER_GROUP_PROTOCOL)

#: ``TURNSTILE_*`` variables that are not settings but are read elsewhere: the config file,
#: the schema folder override, the local broker's folders, the dashboard's token, and
#: development tools.
OTHER_ENV = {
    "TURNSTILE_CONFIG": "the TOML settings file",
    "TURNSTILE_SCHEMA_DIR": "a folder of Avro schemas to use instead of the installed ones",
    "TURNSTILE_KAFKA_DIR": "data folder of the local development broker",
    "TURNSTILE_CACHE_DIR": "cache of the local development broker's jars",
    "TURNSTILE_UI_TOKEN": "the token the dashboard's actions need (turnstile ui --token)",
    "TURNSTILE_UPDATE_GOLDEN": "tests: rewrite golden files",
    "TURNSTILE_PEERS_TMP": "benchmarks: scratch folder of the peer systems",
}


@dataclass(frozen=True)
class Settings:
    bootstrap_servers: str = "127.0.0.1:9092"
    namespace: str = "turnstile"
    #: Partition count of every co-partitioned topic; fixed once topics exist.
    partitions: int = 32
    #: Replication factor of new topics; 0 picks it from the cluster (see
    #: ``engine.config.topics.auto_replication``).
    replication_factor: int = 0
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
    #: Command request ids each instance remembers (the newest this many, none older than
    #: this), so that a command sent again is answered alike instead of applied twice.
    dedup_window: int = 64
    dedup_window_ms: int = 24 * 3600 * 1000
    #: Finished instances (COMPLETED, FAILED, TERMINATED) are purged by the processor this
    #: long after they end (0: kept until purged); ``@workflow(retention=...)`` overrides it.
    retention_ms: int = 0
    #: Hot instances kept in memory per replica.
    cache_instances: int = 10000
    worker_concurrency: int = 16
    worker_id: str = "worker-0"
    #: Processors and workers join their groups as static members (``group.instance.id`` =
    #: replica id / worker id): a crashed one that restarts gets its partitions back at once
    #: instead of after the session timeout.
    static_membership: bool = True
    #: Processor replicas write a liveness record this often (0: not at all) and evict a
    #: peer silent for ``liveness_timeout_ms`` from the group at once, instead of after the
    #: group's 10 s session timeout. Keep the timeout above the longest stall a healthy
    #: replica may have: a false alarm costs a rebalance and a recovery.
    liveness_interval_ms: int = 500
    liveness_timeout_ms: int = 1500
    #: How the processors' consumer group moves partitions: ``classic`` (eager range
    #: rebalances: every replica gives back all its partitions and takes its share again)
    #: or ``consumer`` (KIP-848, Kafka 4.0+: the broker's range assignor moves only the
    #: partitions that change owner; a replica joining or leaving stops nothing else). Under
    #: ``consumer`` replicas join as dynamic members without liveness eviction, so a crashed
    #: replica's partitions move after the group's broker-side session timeout.
    group_protocol: str = CLASSIC_GROUP_PROTOCOL
    #: Warm copies each partition has besides its owner's (like Kafka Streams'
    #: ``num.standby.replicas``): a replica tails the changelogs of the partitions it would
    #: take over if a peer died into its local RocksDB, so a takeover replays only the last
    #: few records instead of restoring the whole table. Costs each standby one changelog
    #: reader, the disk of the copies and the CPU of applying them. Needs liveness and static
    #: membership (the live peers decide who stands by for what).
    standby_replicas: int = 0
    modules: tuple[str, ...] = ()
    #: librdkafka settings added to every Kafka client (security, tuning): ``[kafka]`` in
    #: the TOML file, ``--kafka KEY=VALUE`` flags, or ``TURNSTILE_EXTRA_KAFKA``.
    extra_kafka: dict[str, str] = field(default_factory=dict)
    #: How long a command waits for Kafka to answer before it gives up.
    connect_timeout_ms: int = 5000
    #: An exception the workflow code did not mean (a bug, an unregistered workflow) parks
    #: the instance until fixed code runs it, instead of failing it for good.
    park_workflow_errors: bool = True
    #: Events a parked instance keeps for its retry, by count and bytes (encoded); past
    #: either, a new event goes to dead letters with the reason. The bytes must stay at
    #: most half of ``max_record_bytes`` (they live in the instance's row).
    parked_events_max: int = 1000
    parked_events_max_bytes: int = 256 * 1024
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
    #: Events an instance keeps for later at most: those a continue-as-new carried beyond
    #: what the next generation is given at once, and those that arrived behind them (past
    #: it, or a quarter of max_record_bytes, an event goes to dead letters).
    backlog_events_max: int = 10_000
    #: The history of one generation: from ``*_warn`` events or bytes on, a WARNING is
    #: logged and ``ctx.continue_as_new_suggested`` is True; a turn that takes it past
    #: ``*_max`` fails the instance. ``@workflow(history_events_warn=..., ...)`` overrides
    #: the event counts per workflow. (Temporal's defaults: 10,240 / 51,200 events.)
    history_events_warn: int = 10_240
    history_events_max: int = 51_200
    history_bytes_warn: int = 10 * 1024 * 1024
    history_bytes_max: int = 50 * 1024 * 1024
    #: User topics workflows may publish to with ``ctx.publish`` (``[publish] topics`` in
    #: the config file); any other topic fails the publishing instance.
    publish_topics: tuple[str, ...] = ()
    #: Business topics whose records start workflows or raise events (``[[triggers]]``,
    #: ``--trigger TOPIC:WORKFLOW[:ACTION]``); see engine.config.triggers.
    triggers: tuple[Trigger, ...] = ()
    #: A Confluent-compatible Schema Registry (``http://HOST:PORT``); empty: none. With one,
    #: commands in the registry's wire format are accepted beside single-object ones.
    schema_registry_url: str = ""
    #: How the processor writes history, status and command outcomes: ``single-object``
    #: (needs no registry) or ``confluent`` (magic byte, schema id, Avro; the schemas are
    #: registered under ``<topic>-value``), for tools that read the registry's format.
    wire_format: str = "single-object"
    #: The codec chain new payloads go through, first to last (``zstd``, ``aes-gcm`` or a
    #: registered codec's name); ``[payloads] codecs`` in the config file. Empty: none.
    payload_codecs: tuple[str, ...] = ()
    #: A file of AES-GCM keys, ``KEY_ID:BASE64`` one per line, oldest first (the last one
    #: encrypts); ``[payloads] key_file``.
    payload_key_file: str = ""
    #: More keys in the same form, comma-separated, after the file's (usually given as
    #: ``TURNSTILE_PAYLOAD_KEYS``); never shown in the settings' repr.
    payload_keys: str = field(default="", repr=False)
    #: A payload above this many bytes is kept in chunks on the ``<namespace>.payloads``
    #: topic and the record carries a reference to it; 0: every payload inline.
    #: ``[payloads] inline_max_bytes``.
    payload_inline_max_bytes: int = DEFAULT_INLINE_MAX
    #: The largest payload (input, result, event, output) a workflow may move; above it
    #: the instance fails alone and the client refuses to send. ``[payloads] max_bytes``.
    payload_max_bytes: int = DEFAULT_PAYLOAD_MAX

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
                payload_inline=self.payload_inline_max_bytes,
                payload_max=self.payload_max_bytes,
            )
        except ValueError as exc:
            raise ConfigurationError(f"size limits: {exc}") from exc

    @property
    def history_limits(self) -> HistoryLimits:
        """The history limits of one generation, checked together (warn below max)."""
        try:
            return HistoryLimits(
                events_warn=self.history_events_warn,
                events_max=self.history_events_max,
                bytes_warn=self.history_bytes_warn,
                bytes_max=self.history_bytes_max,
            )
        except ValueError as exc:
            raise ConfigurationError(f"history limits: {exc}") from exc

    @property
    def processor_group(self) -> str:
        return f"{self.namespace}.processor"

    @property
    def worker_group(self) -> str:
        return f"{self.namespace}.worker"

    @property
    def connect_timeout_s(self) -> float:
        return self.connect_timeout_ms / 1000


#: Other names accepted for a setting: an environment variable and the TOML table name.
_ENV_ALIASES = {"ENGINE_BOOTSTRAP_SERVERS": "bootstrap_servers"}
_TOML_ALIASES = {"kafka": "extra_kafka"}


def env_name(setting: str) -> str:
    """The environment variable of a setting (``partitions`` -> ``TURNSTILE_PARTITIONS``)."""
    return ENV_PREFIX + setting.upper()


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    kafka: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Settings:
    """Build settings: defaults < TOML file < environment < explicit overrides (flags).

    The TOML file may hold the keys at top level or under ``[turnstile]``, and Kafka client
    settings in a ``[kafka]`` table. Environment variables are ``TURNSTILE_<SETTING>``
    (``ENGINE_BOOTSTRAP_SERVERS`` is also honoured for the bootstrap servers). ``kafka``
    holds librdkafka settings given as flags; they win over the file and the environment.
    """
    env = dict(os.environ) if env is None else dict(env)
    values: dict[str, Any] = {}
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        values.update(_from_toml(Path(path)))
    values.update(_from_env(env))
    values.update({k: v for k, v in overrides.items() if v is not None})
    settings = _coerce(Settings(), values)
    if kafka:
        settings = replace(settings, extra_kafka={**settings.extra_kafka, **dict(kafka)})
    _validate(settings)
    return settings


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
    values: dict[str, Any] = {str(_TOML_ALIASES.get(k, k)): v for k, v in section.items()}
    if "turnstile" in data and isinstance(data.get("kafka"), dict):
        values["extra_kafka"] = {**data["kafka"], **values.get("extra_kafka", {})}
    if "turnstile" in data and "triggers" in data:
        values.setdefault("triggers", data["triggers"])
    payloads = data.get("payloads", values.pop("payloads", None))
    if payloads is not None:
        values.update(_payloads_table(path, payloads))
    publish = data.get("publish", values.pop("publish", None))
    if publish is not None:
        values["publish_topics"] = _publish_table(path, publish)
    return values


def _publish_table(path: Path, table: Any) -> Any:
    """``[publish]``: ``topics = [...]``, the topics workflows may publish to."""
    if not isinstance(table, dict) or set(table) - {"topics"}:
        raise ConfigurationError(
            f'config file {path}: [publish] takes one key, topics = ["TOPIC", ...]'
        )
    return table.get("topics", [])


_PAYLOADS_KEYS = ("codecs", "key_file", "keys", "inline_max_bytes", "max_bytes")


def _payloads_table(path: Path, table: Any) -> dict[str, Any]:
    """``[payloads]``: ``codecs``, ``key_file`` and ``keys`` (the ``payload_*`` settings)."""
    if not isinstance(table, dict) or set(table) - set(_PAYLOADS_KEYS):
        raise ConfigurationError(
            f"config file {path}: [payloads] takes the keys {', '.join(_PAYLOADS_KEYS)}, "
            f'for example codecs = ["zstd", "aes-gcm"] and key_file = "keys.txt"'
        )
    return {f"payload_{key}": value for key, value in table.items()}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for alias, name in _ENV_ALIASES.items():
        if alias in env:
            out[name] = env[alias]
    known = {env_name(f.name): f.name for f in fields(Settings)}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX) or key in OTHER_ENV:
            continue
        if key not in known:
            raise ConfigurationError(
                f"unknown environment variable {key}{_did_you_mean(key, [*known, *OTHER_ENV])}; "
                f"unset it or fix its name (docs/reference/settings.md)"
            )
        out[known[key]] = value
    return out


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _coerce(base: Settings, values: dict[str, Any]) -> Settings:
    known = {f.name: f for f in fields(Settings)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        hints = "".join(_did_you_mean(name, list(known)) for name in unknown)
        raise ConfigurationError(
            f"unknown setting(s) {', '.join(unknown)}{hints}; known settings are "
            f"{', '.join(sorted(known))}"
        )
    converted: dict[str, Any] = {}
    for name, raw in values.items():
        current = getattr(base, name)
        converted[name] = _convert(name, raw, current)
    return replace(base, **converted)


def _convert(name: str, raw: Any, current: Any) -> Any:
    if name == "triggers":
        return parse_triggers(raw)
    try:
        if isinstance(current, bool):
            return raw if isinstance(raw, bool) else _parse_bool(str(raw))
        if isinstance(current, int):
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError("expected a whole number")
            return int(raw)
        if isinstance(current, tuple):
            if isinstance(raw, str):
                return tuple(p.strip() for p in raw.split(",") if p.strip())
            return tuple(str(p) for p in raw)
        if isinstance(current, dict):
            return parse_kafka_settings(raw) if isinstance(raw, str) else _str_dict(raw)
        return str(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"setting {name}={raw!r} is not valid: {exc}") from exc


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("expected true or false")


def _str_dict(raw: Any) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        raise ValueError("expected a table of KEY = VALUE")
    return {str(k): _kafka_value(v) for k, v in raw.items()}


def _kafka_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_kafka_settings(text: str) -> dict[str, str]:
    """librdkafka settings from one string: a JSON object, or ``KEY=VALUE`` lines.

    Values may contain commas and ``=`` (passwords do): a line is split at its first ``=``
    only, and lines are separated by newlines, never by commas.
    """
    stripped = text.strip()
    if stripped.startswith("{"):
        return _str_dict(json.loads(stripped))
    out: dict[str, str] = {}
    for line in stripped.splitlines():
        if line.strip():
            key, value = parse_kafka_pair(line)
            out[key] = value
    return out


def parse_kafka_pair(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` -> ``(KEY, VALUE)``, split at the first ``=``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected KEY=VALUE (a librdkafka setting), got {text!r}")
    return key.strip(), value.strip()


# --- validation -----------------------------------------------------------------------------


def _positive(name: str, value: int) -> str | None:
    return None if value >= 1 else f"{name} must be at least 1, got {value}"


def _not_negative(name: str, value: int) -> str | None:
    return None if value >= 0 else f"{name} must not be negative, got {value}"


def _not_empty(name: str, value: str) -> str | None:
    return None if value.strip() else f"{name} must not be empty"


_CHECKS: dict[str, Callable[[str, Any], str | None]] = {
    "bootstrap_servers": lambda _name, value: bootstrap_servers_problem(value),
    "namespace": _not_empty,
    "partitions": _positive,
    "replication_factor": _not_negative,
    "state_dir": _not_empty,
    "replica_id": _not_empty,
    "max_batch": _positive,
    "max_batch_ms": _not_negative,
    "pending_events_max": _not_negative,
    "pending_events_ttl_ms": _not_negative,
    "parked_events_max": _not_negative,
    "parked_events_max_bytes": _not_negative,
    "dedup_window": _not_negative,
    "dedup_window_ms": _not_negative,
    "retention_ms": _not_negative,
    "cache_instances": _positive,
    "liveness_interval_ms": _not_negative,
    "liveness_timeout_ms": _positive,
    "group_protocol": lambda name, value: (
        None
        if value in GROUP_PROTOCOLS
        else f"{name}={value!r} is not a group protocol; use one of {', '.join(GROUP_PROTOCOLS)}"
    ),
    "standby_replicas": _not_negative,
    "worker_concurrency": _positive,
    "worker_id": _not_empty,
    "connect_timeout_ms": _positive,
    "max_workflow_input_bytes": _positive,
    "max_workflow_output_bytes": _positive,
    "max_activity_input_bytes": _positive,
    "max_activity_result_bytes": _positive,
    "max_event_bytes": _positive,
    "max_custom_status_bytes": _positive,
    "max_record_bytes": _positive,
    "payload_inline_max_bytes": _not_negative,
    "payload_max_bytes": _positive,
    "turn_budget_ms": _positive,
    "turn_max_events": _positive,
    "backlog_events_max": _positive,
    "history_events_warn": _positive,
    "history_events_max": _positive,
    "history_bytes_warn": _positive,
    "history_bytes_max": _positive,
    "schema_registry_url": lambda _name, value: schema_registry_url_problem(value),
    "wire_format": lambda _name, value: wire_format_problem(value),
}


def _validate(settings: Settings) -> None:
    for name, check in _CHECKS.items():
        problem = check(name, getattr(settings, name))
        if problem:
            raise ConfigurationError(
                f"{problem} (setting {name}: --{name.replace('_', '-')} or {env_name(name)})"
            )
    settings.limits  # noqa: B018 - raises ConfigurationError when the limits do not fit
    _check_failover(settings)
    if settings.parked_events_max_bytes > settings.max_record_bytes // 2:
        raise ConfigurationError(
            f"parked_events_max_bytes={settings.parked_events_max_bytes} must be at most half "
            f"of max_record_bytes={settings.max_record_bytes}: a parked instance keeps its "
            f"events in its row, which is one record; lower it or raise max_record_bytes"
        )
    settings.history_limits  # noqa: B018 - and when a warning size is above its maximum
    _check_payload_codecs(settings)
    if settings.wire_format == CONFLUENT_WIRE_FORMAT and not settings.schema_registry_url:
        raise ConfigurationError(
            "wire_format = confluent needs a Schema Registry: set schema_registry_url "
            "(in the config file or TURNSTILE_SCHEMA_REGISTRY_URL), or use single-object"
        )


def _check_failover(settings: Settings) -> None:
    """Liveness and standby settings that only make sense together."""
    if settings.liveness_interval_ms and (
        settings.liveness_timeout_ms < 2 * settings.liveness_interval_ms
    ):
        raise ConfigurationError(
            f"liveness_timeout_ms={settings.liveness_timeout_ms} must be at least twice "
            f"liveness_interval_ms={settings.liveness_interval_ms}: one late record must not "
            f"get a replica evicted; raise the timeout or lower the interval"
        )
    if settings.standby_replicas and not (
        settings.liveness_interval_ms and settings.static_membership
    ):
        raise ConfigurationError(
            f"standby_replicas={settings.standby_replicas} needs liveness records "
            f"(liveness_interval_ms > 0) and static membership (static_membership = true): "
            f"the live peers decide which partitions a replica stands by for; turn them on "
            f"or set standby_replicas = 0"
        )
    if settings.standby_replicas and settings.group_protocol != CLASSIC_GROUP_PROTOCOL:
        raise ConfigurationError(
            f"standby_replicas={settings.standby_replicas} needs group_protocol = "
            f"{CLASSIC_GROUP_PROTOCOL!r}: a replica stands by for the partitions the classic "
            f"range assignor would give it, which the broker's assignor of the "
            f"{settings.group_protocol!r} protocol does not follow; choose one of the two"
        )


def _check_payload_codecs(settings: Settings) -> None:
    codecs = settings.payload_codecs
    if len(set(codecs)) != len(codecs):
        raise ConfigurationError(
            f"payload_codecs={list(codecs)} names a codec twice; name each once"
        )
    if "aes-gcm" in codecs and not (settings.payload_key_file or settings.payload_keys):
        raise ConfigurationError(
            "payload_codecs has aes-gcm but no key: set payload_key_file ([payloads] "
            "key_file) or TURNSTILE_PAYLOAD_KEYS to KEY_ID:BASE64 (docs/how-to/payloads.md)"
        )


#: The values of the ``wire_format`` setting.
SINGLE_OBJECT_WIRE_FORMAT = "single-object"
CONFLUENT_WIRE_FORMAT = "confluent"
WIRE_FORMATS = (SINGLE_OBJECT_WIRE_FORMAT, CONFLUENT_WIRE_FORMAT)


def wire_format_problem(value: str) -> str | None:
    if value in WIRE_FORMATS:
        return None
    return f"wire_format {value!r} must be one of {', '.join(WIRE_FORMATS)}"


def schema_registry_url_problem(value: str) -> str | None:
    """A registry URL is ``http(s)://HOST[:PORT][/PATH]`` (or empty: no registry)."""
    if not value:
        return None
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() not in {"http", "https"} or not rest.strip("/"):
        return (
            f"schema_registry_url {value!r} must be an http:// or https:// URL, for example "
            f"http://127.0.0.1:8081"
        )
    return None


def bootstrap_servers_problem(value: str) -> str | None:
    """What is wrong with a ``bootstrap.servers`` list, or None.

    Kafka addresses are ``host:port`` (comma-separated); a URL such as ``http://...`` is a
    common mistake that librdkafka would only report as an endless connection failure.
    """
    entries = [e.strip() for e in value.split(",")]
    if not value.strip() or not all(entries):
        return f"bootstrap_servers {value!r} must be HOST:PORT[,HOST:PORT...]"
    for entry in entries:
        scheme, sep, address = entry.rpartition("://")
        if sep and scheme.lower() in {"http", "https"}:
            return (
                f"bootstrap server {entry!r} is a web URL; Kafka speaks its own protocol, "
                f"give HOST:PORT (for example {address.split('/')[0] or '127.0.0.1:9092'})"
            )
        host, colon, port = (address if sep else entry).rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            return f"bootstrap server {entry!r} must be HOST:PORT with a port from 1 to 65535"
    return None
