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
