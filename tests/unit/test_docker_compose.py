"""docker-compose.yml must describe the same Kafka as the local broker, reachable only locally.

Each service gets its own expectations below; the port rule applies to every service, so
services added later are held to it without changing these tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "docker-compose.yml"

KAFKA_SETTINGS = {
    "KAFKA_PROCESS_ROLES": "broker,controller",
    "KAFKA_NODE_ID": "1",
    "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
    "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
    "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
    "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
    "KAFKA_NUM_PARTITIONS": "1",
}


def _compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict), "docker-compose.yml must be a mapping"
    return loaded


def _services() -> dict[str, dict[str, Any]]:
    services = _compose().get("services")
    assert isinstance(services, dict) and services, "docker-compose.yml declares no services"
    return services


def _environment(service: dict[str, Any]) -> dict[str, str]:
    """The environment as a dict, whether written as a mapping or as KEY=VALUE items."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _published_ports(service: dict[str, Any]) -> list[str]:
    """Port entries in short syntax ("HOST_IP:HOST:CONTAINER"), long syntax made short."""
    ports = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            host_ip = entry.get("host_ip", "")
            entry = f"{host_ip}:{entry.get('published', '')}:{entry.get('target', '')}"
        ports.append(str(entry))
    return ports


def test_kafka_service_exists_with_a_pinned_official_image() -> None:
    kafka = _services()["kafka"]
    image = kafka["image"]
    name, _, tag = image.partition(":")
    assert name == "apache/kafka"
    assert tag and tag != "latest" and tag[0].isdigit(), f"pin a version, not {image!r}"


@pytest.mark.parametrize("service_name", sorted(_services()))
def test_every_published_port_is_bound_to_localhost(service_name: str) -> None:
    for port in _published_ports(_services()[service_name]):
        assert port.startswith("127.0.0.1:"), f"{service_name} publishes {port} beyond localhost"


def test_kafka_is_published_on_9092() -> None:
    assert "127.0.0.1:9092:9092" in _published_ports(_services()["kafka"])


@pytest.mark.parametrize(("setting", "value"), sorted(KAFKA_SETTINGS.items()))
def test_kafka_single_node_settings(setting: str, value: str) -> None:
    assert _environment(_services()["kafka"]).get(setting) == value


def test_kafka_advertises_the_published_address() -> None:
    env = _environment(_services()["kafka"])
    assert "127.0.0.1:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert "CONTROLLER" in env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert env.get("CLUSTER_ID"), "the image needs a cluster id to format storage"


def test_kafka_has_a_healthcheck() -> None:
    healthcheck = _services()["kafka"].get("healthcheck") or {}
    assert healthcheck.get("test"), "dependent services wait on Kafka's health"


# --- the engine's services ----------------------------------------------------------------------

PROCESSORS = ("processor-0", "processor-1")
ENGINE_SERVICES = ("topics-init", *PROCESSORS, "worker")
INTERNAL_BOOTSTRAP = "kafka:19092"


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def _option(command: list[str], flag: str) -> list[str]:
    """Every value given to ``flag`` in ``command``."""
    return [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == flag]


@pytest.mark.parametrize("name", ENGINE_SERVICES)
def test_engine_services_run_the_image_built_from_the_dockerfile(name: str) -> None:
    service = _services()[name]
    assert service["image"].startswith("turnstile-engine:"), service["image"]
    assert "latest" not in service["image"]
    build = service.get("build") or {}
    assert build.get("context") == "." and build.get("dockerfile", "Dockerfile") == "Dockerfile"
    assert not service.get("entrypoint"), "the image's entrypoint (turnstile) runs the command"
    assert _command(service)[0] in {"run", "topics"}, "arguments of the turnstile command"
    mounts = [str(v) for v in service.get("volumes", [])]
    assert not any(m.startswith((".", "/")) for m in mounts), "no source mount: the image has it"
    assert not service.get("ports"), "engine services publish no ports"


@pytest.mark.parametrize("name", [*PROCESSORS, "worker"])
def test_long_running_engine_services_have_a_healthcheck(name: str) -> None:
    healthcheck = _services()[name].get("healthcheck") or {}
    assert not healthcheck.get("disable")
    test = healthcheck.get("test") or []
    assert test[:2] == ["CMD", "turnstile"], test


def test_kafka_keeps_its_data_in_a_volume() -> None:
    kafka = _services()["kafka"]
    log_dirs = _environment(kafka)["KAFKA_LOG_DIRS"]
    mounts = [str(v) for v in kafka.get("volumes", []) if str(v).endswith(f":{log_dirs}")]
    assert len(mounts) == 1, f"Kafka's log dirs {log_dirs} must be a volume"
    assert mounts[0].split(":")[0] in (_compose().get("volumes") or {})


@pytest.mark.parametrize("name", ENGINE_SERVICES)
def test_engine_services_reach_kafka_on_its_internal_listener(name: str) -> None:
    service = _services()[name]
    env = _environment(service)
    assert env.get("TURNSTILE_BOOTSTRAP_SERVERS") == INTERNAL_BOOTSTRAP
    assert env.get("TURNSTILE_NAMESPACE")
    assert env.get("TURNSTILE_PARTITIONS", "").isdigit()
    depends = service.get("depends_on") or {}
    assert depends.get("kafka", {}).get("condition") == "service_healthy"


def test_kafka_has_a_listener_for_containers() -> None:
    env = _environment(_services()["kafka"])
    host, _, port = INTERNAL_BOOTSTRAP.partition(":")
    assert f"//{host}:{port}" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert f":{port}" in env["KAFKA_LISTENERS"]
    assert _services()["kafka"].get("hostname", "kafka") == host


def test_topics_init_applies_the_topics_once() -> None:
    service = _services()["topics-init"]
    assert _command(service)[:2] == ["topics", "apply"]
    assert service.get("restart", "no") == "no"


@pytest.mark.parametrize("name", [*PROCESSORS, "worker"])
def test_engine_services_start_after_the_topics_exist(name: str) -> None:
    depends = _services()[name].get("depends_on") or {}
    assert depends.get("topics-init", {}).get("condition") == "service_completed_successfully"


def test_two_processor_replicas_with_their_own_ids_and_state() -> None:
    replica_ids = []
    state_volumes = []
    for name in PROCESSORS:
        service = _services()[name]
        command = _command(service)
        assert command[:2] == ["run", "processor"]
        assert "engine.examples.orders" in _option(command, "--module")
        [replica_id] = _option(command, "--replica-id")
        [state_dir] = _option(command, "--state-dir")
        replica_ids.append(replica_id)
        mounts = [v for v in service.get("volumes", []) if str(v).endswith(f":{state_dir}")]
        assert len(mounts) == 1, f"{name} keeps its state in a volume at {state_dir}"
        state_volumes.append(mounts[0].split(":")[0])
    assert len(set(replica_ids)) == len(PROCESSORS), "replica ids must differ"
    assert len(set(state_volumes)) == len(PROCESSORS), "each replica has its own state"
    assert set(state_volumes) <= set(_compose().get("volumes") or {})


def test_a_worker_runs_the_example_activities() -> None:
    command = _command(_services()["worker"])
    assert command[:2] == ["run", "worker"]
    assert "engine.examples.orders" in _option(command, "--module")
    assert _option(command, "--worker-id")


# --- metrics: Prometheus and Grafana -----------------------------------------------------------

OPS = COMPOSE_FILE.parent / "engine" / "ops"


def _metric_families() -> set[str]:
    """The names of the engine's metric families (counters without their _total)."""
    from engine.adapters.metrics import ProcessorMetrics, WorkerMetrics

    return {
        family.name
        for metrics in (ProcessorMetrics(), WorkerMetrics())
        for family in metrics.registry.collect()
    }


def test_prometheus_scrapes_every_engine_process_on_its_metrics_port() -> None:
    services = _services()
    scraped = yaml.safe_load((OPS / "prometheus.yml").read_text(encoding="utf-8"))
    targets = {
        t for job in scraped["scrape_configs"] for c in job["static_configs"] for t in c["targets"]
    }
    for name in (*PROCESSORS, "worker"):
        command = _command(services[name])
        port = _option(command, "--metrics-port")
        assert port, f"{name} serves no metrics"
        assert f"{name}:{port[0]}" in targets, f"Prometheus does not scrape {name}"
    mounted = services["prometheus"]["volumes"]
    assert "./engine/ops/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounted


def test_the_grafana_dashboard_only_charts_metrics_the_engine_exposes() -> None:
    import json
    import re

    dashboard = json.loads((OPS / "grafana" / "dashboards" / "turnstile.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {m for expr in exprs for m in re.findall(r"\bturnstile_[a-z_]+", expr)}
    families = _metric_families()

    def family(sample: str) -> str:
        for suffix in ("_total", "_bucket", "_sum", "_count"):
            if sample.endswith(suffix) and sample.removesuffix(suffix) in families:
                return sample.removesuffix(suffix)
        return sample

    charted = {family(name) for name in used}
    assert charted <= families, f"charts of unknown metrics: {sorted(charted - families)}"
    assert families <= charted, f"metrics no panel shows: {sorted(families - charted)}"
    volumes = _services()["grafana"]["volumes"]
    assert "./engine/ops/grafana/dashboards:/var/lib/grafana/dashboards:ro" in volumes
