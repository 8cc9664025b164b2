"""SASL/SCRAM over TLS, and optionally ACLs, for the local development broker.

Production clusters authenticate their clients; the engine's security settings (librdkafka's
``security.protocol``, ``sasl.*``, ``ssl.*``) are tested against this broker configured the
same way. The client listener speaks SASL_SSL with SCRAM; the broker authenticates to itself
(inter-broker traffic) as the admin user, whose SCRAM credential is written into the KRaft
log when the storage is formatted (KRaft has no ZooKeeper to add it to later). Further users
are added through the admin API (``alter_user_scram_credentials``).

With ``acls`` the broker runs Kafka's ``StandardAuthorizer`` and denies whatever no ACL
allows. The admin user is a super user, and so is the anonymous principal of the controller
listener, which stays PLAINTEXT on 127.0.0.1: the node talks to its own controller over it,
and controller requests need cluster rights. Clients use the SASL_SSL port only.

Standard library only, like the launcher.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["BrokerSecurity"]

LISTENER = "SASL_SSL"


@dataclass(frozen=True)
class BrokerSecurity:
    """How the local broker's client listener is secured.

    ``keystore`` is a PEM file with the broker's private key (PKCS#8, not encrypted) and its
    certificate chain; the certificate must name 127.0.0.1 (subjectAltName ``IP:127.0.0.1``),
    since clients check it. ``ca`` is the CA certificate clients trust (``ssl.ca.location``).
    """

    keystore: Path
    ca: Path
    admin_password: str
    admin_user: str = "admin"
    mechanism: str = "SCRAM-SHA-512"
    acls: bool = False

    def properties(self, host: str, broker_port: int, controller_port: int) -> dict[str, str]:
        """The server.properties entries that replace the PLAINTEXT client listener."""
        jaas = (
            f"org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{self.admin_user}" password="{self.admin_password}";'
        )
        props = {
            "listeners": f"{LISTENER}://{host}:{broker_port},CONTROLLER://{host}:{controller_port}",
            "advertised.listeners": f"{LISTENER}://{host}:{broker_port}",
            "inter.broker.listener.name": LISTENER,
            "listener.security.protocol.map": f"CONTROLLER:PLAINTEXT,{LISTENER}:{LISTENER}",
            "sasl.enabled.mechanisms": self.mechanism,
            "sasl.mechanism.inter.broker.protocol": self.mechanism,
            f"listener.name.sasl_ssl.{self.mechanism.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
        }
        if self.acls:
            props["authorizer.class.name"] = (
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
            )
            props["super.users"] = f"User:{self.admin_user};User:ANONYMOUS"
            props["allow.everyone.if.no.acl.found"] = "false"
        return props

    def format_args(self) -> list[str]:
        """``kafka-storage format`` arguments that create the admin's SCRAM credential."""
        return [
            "--add-scram",
            f"{self.mechanism}=[name={self.admin_user},password={self.admin_password}]",
        ]

    def client_config(self, user: str | None = None, password: str | None = None) -> dict[str, str]:
        """librdkafka settings for a client of this broker (the admin unless told)."""
        return {
            "security.protocol": LISTENER,
            "sasl.mechanisms": self.mechanism,
            "sasl.username": user or self.admin_user,
            "sasl.password": password if password is not None else self.admin_password,
            "ssl.ca.location": str(self.ca),
        }
