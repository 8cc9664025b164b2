"""SASL/SCRAM over TLS and ACLs, against a local broker of this test's own.

The certificates are made here with ``openssl``: a CA, and a broker certificate for
127.0.0.1 signed by it. The broker's client listener speaks SASL_SSL with SCRAM-SHA-512 and
runs Kafka's StandardAuthorizer, denying whatever no ACL allows. Each engine role gets a user
of its own and exactly the ACLs ``engine.config.acls`` lists for it (the list the docs
prints as kafka-acls commands); the processor, the worker and the client then run a workflow
with activities end to end, configured only through the engine's settings. The same users
are refused what their role does not need, and a wrong password or a plaintext client gets
a clear error.
"""

from __future__ import annotations

import secrets
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import engine.examples.chain3  # noqa: F401  (registers chain3.activities)
from engine.adapters.kafka import admin as kafka_admin
from engine.config.acls import ROLES, required_acls
from engine.config.settings import Settings, load_settings
from engine.config.topics import load_spec, topic_names
from engine.core.errors import BrokerError
from engine.core.history import RuntimeStatus
from engine.dev.kafka_security import BrokerSecurity
from engine.dev.local_kafka import LocalKafka
from engine.runtime.registry import default_registry

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

NAMESPACE = "secure"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(folder: Path) -> tuple[Path, Path]:
    """A CA and a broker certificate for 127.0.0.1; returns (keystore PEM, CA PEM)."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=turnstile test CA", cwd=folder,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
        "-subj", "/CN=127.0.0.1", cwd=folder,
    )  # fmt: skip
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "broker.pem", "-days", "2", "-extfile", "san.cnf", cwd=folder,
    )  # fmt: skip
    keystore = folder / "keystore.pem"
    keystore.write_text((folder / "broker.key").read_text() + (folder / "broker.pem").read_text())
    return keystore, folder / "ca.pem"


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, BrokerSecurity]]:
    folder = tmp_path_factory.mktemp("secure")
    keystore, ca = make_certificates(folder / "tls")
    security = BrokerSecurity(keystore, ca, admin_password=secrets.token_hex(8), acls=True)
    broker = LocalKafka(folder / "broker", security=security)
    bootstrap = broker.start(timeout=120.0, fresh=True)
    try:
        yield bootstrap, security
    finally:
        broker.stop()


def _settings(bootstrap: str, kafka: dict[str, str], **extra: Any) -> Settings:
    return load_settings(
        bootstrap_servers=bootstrap,
        namespace=NAMESPACE,
        partitions=2,
        kafka=kafka,
        env={},
        **extra,
    )


def _admin_client(bootstrap: str, security: BrokerSecurity) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, **security.client_config()})


def _add_user(admin: Any, security: BrokerSecurity, user: str, password: str) -> None:
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    upsert = UserScramCredentialUpsertion(user, info, password.encode())
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)


def _grant(admin: Any, role: str, principal: str) -> None:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    kinds = {
        "topic": ResourceType.TOPIC,
        "group": ResourceType.GROUP,
        "transactional-id": ResourceType.TRANSACTIONAL_ID,
    }
    bindings = [
        AclBinding(
            kinds[acl.resource],
            acl.name,
            ResourcePatternType.PREFIXED if acl.prefixed else ResourcePatternType.LITERAL,
            principal,
            "*",
            AclOperation[acl.operation],
            AclPermissionType.ALLOW,
        )
        for acl in required_acls(NAMESPACE, role)
    ]
    for future in admin.create_acls(bindings).values():
        future.result(timeout=30)


@pytest.fixture(scope="module")
def users(secure_broker: tuple[str, BrokerSecurity]) -> dict[str, dict[str, str]]:
    """One SCRAM user per role with that role's ACLs; the topics created as the admin."""
    bootstrap, security = secure_broker
    admin = _admin_client(bootstrap, security)
    kafka: dict[str, dict[str, str]] = {}
    for role in ROLES:
        password = secrets.token_hex(8)
        _add_user(admin, security, f"turnstile-{role}", password)
        _grant(admin, role, f"User:turnstile-{role}")
        kafka[role] = security.client_config(f"turnstile-{role}", password)
    kafka_admin.apply(load_spec(), _settings(bootstrap, security.client_config()))
    return kafka


def test_the_engine_runs_over_sasl_ssl_with_only_its_roles_acls(
    secure_broker: tuple[str, BrokerSecurity], users: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    from engine.adapters.kafka.processor import ProcessorRunner
    from engine.adapters.kafka.worker import KafkaWorker
    from engine.client import Client

    bootstrap, _ = secure_broker
    base = _settings(bootstrap, {}, state_dir=str(tmp_path / "state"))
    kafka_admin.ensure_topics(replace(base, extra_kafka=users["processor"]), load_spec(), 30)
    kafka_admin.ensure_topics(replace(base, extra_kafka=users["worker"]), load_spec(), 30)
    stop = threading.Event()
    runner = ProcessorRunner(replace(base, extra_kafka=users["processor"]), default_registry)
    worker = KafkaWorker(replace(base, extra_kafka=users["worker"]), default_registry)
    threads = [
        threading.Thread(target=runner.run, args=(stop,), name="processor"),
        threading.Thread(target=worker.run, args=(stop,), name="worker"),
    ]
    for thread in threads:
        thread.start()
    try:
        with Client(settings=replace(base, extra_kafka=users["client"])) as client:
            ids = {client.start("chain3.activities", i): i + 3 for i in range(10)}
            for instance, output in ids.items():
                state = client.wait_for_completion(instance, timeout=120)
                assert (state.status, state.output) == (RuntimeStatus.COMPLETED, output)
    finally:
        stop.set()
        for thread in threads:
            thread.join(90)
    assert runner.progress.completed == 10 and runner.progress.aborts == 0


def _produce(bootstrap: str, kafka: dict[str, str], topic: str) -> str:
    """Produce one record; the delivery error's name, or "" when it was written."""
    from confluent_kafka import Producer

    errors: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, **kafka})
    producer.produce(
        topic, b"x", on_delivery=lambda err, _: errors.append(err.name() if err else "")
    )
    producer.flush(30)
    return errors[0] if errors else "no delivery report"


def test_each_role_is_refused_what_it_does_not_need(
    secure_broker: tuple[str, BrokerSecurity], users: dict[str, dict[str, str]]
) -> None:
    bootstrap, _ = secure_broker
    topics = topic_names(NAMESPACE)
    assert _produce(bootstrap, users["worker"], topics.commands) == "TOPIC_AUTHORIZATION_FAILED"
    assert _produce(bootstrap, users["client"], topics.history) == "TOPIC_AUTHORIZATION_FAILED"
    assert _produce(bootstrap, users["client"], topics.activity_tasks) == (
        "TOPIC_AUTHORIZATION_FAILED"
    )
    assert _produce(bootstrap, users["processor"], topics.commands) == (
        "TOPIC_AUTHORIZATION_FAILED"
    )
    assert _produce(bootstrap, users["client"], topics.commands) == ""


def test_a_wrong_password_or_a_plaintext_client_gets_a_clear_error(
    secure_broker: tuple[str, BrokerSecurity], users: dict[str, dict[str, str]]
) -> None:
    bootstrap, security = secure_broker
    wrong = security.client_config("turnstile-client", "not-the-password")
    with pytest.raises(BrokerError, match="refused the credentials"):
        kafka_admin.ensure_reachable(_settings(bootstrap, wrong), 10)
    with pytest.raises(BrokerError, match=r"set security\.protocol and the sasl"):
        kafka_admin.ensure_reachable(_settings(bootstrap, {}), 10)
