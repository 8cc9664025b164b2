"""The Kafka ACLs each engine role needs: nothing more than the operations it uses.

One list serves three purposes: docs/how-to/security-and-clusters.md prints it as
``kafka-acls.sh`` commands, the security test creates exactly these ACLs on a broker with an
authorizer and runs the engine under them, and ``topics.toml`` names stay the single source
of the topic names. Pure data: no Kafka client is imported here.

Roles:

- ``processor``: reads its three input topics and the two changelogs (restore), writes the
  history, status, command outcomes, changelogs, instance messages and dead letters, reads
  and writes the payloads topic (large payloads), and
  activity tasks and cancellations on every task queue (the topics named by the prefix
  ``<namespace>.activity-tasks``), commits offsets for its group inside transactions under
  ``<namespace>.processor.<replica id>``.
- ``worker``: reads its task queues and writes to them (a task it does not serve goes back
  to its queue), reads and writes the payloads topic, writes activity results and dead
  letters with an idempotent producer (no
  transactions, so no transactional id; since Kafka 3.0 idempotence needs only WRITE on the
  topics), commits offsets for its group.
- ``client``: writes commands, reads the status topic and the command outcomes (both
  assigned every partition; it joins no group), reads and writes the payloads topic (a
  large start input or event, a large result).

A processor that publishes (``publish_topics``) or runs triggers (``triggers``) also writes
those user topics, or reads the trigger topics in the group ``<namespace>.triggers`` and
writes the commands it turns their records into; :func:`required_acls` adds exactly that
when it is given the topics.

Every role may describe the engine's topics and their configs (the start-up checks compare
them with the spec). ``topics apply`` (creating and altering topics) and the audit commands
(reading the history topic) are for an operator's principal with wider rights; so is
creating the topic of a new task queue (``topics apply --task-queue Q``): processors and
workers create a missing queue topic only where their principal may.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.config.topics import TopicNames, topic_names

__all__ = ["ROLES", "Acl", "kafka_acls_commands", "required_acls"]

ROLES = ("processor", "worker", "client")


@dataclass(frozen=True)
class Acl:
    """One ALLOW rule: ``operation`` on a resource (``topic``, ``group`` or
    ``transactional-id``) named ``name`` exactly or, when ``prefixed``, by prefix."""

    resource: str
    name: str
    operation: str
    prefixed: bool = False

    def kafka_acls_args(self, principal: str) -> str:
        """The arguments of ``kafka-acls.sh --add`` that create this rule."""
        option = {"topic": "--topic", "group": "--group", "transactional-id": "--transactional-id"}
        pattern = " --resource-pattern-type prefixed" if self.prefixed else ""
        operation = "".join(word.title() for word in self.operation.split("_"))
        return (
            f"--allow-principal {principal} --operation {operation} "
            f"{option[self.resource]} {self.name}{pattern}"
        )


def _describe_topics(namespace: str) -> list[Acl]:
    prefix = f"{namespace}."
    return [
        Acl("topic", prefix, "DESCRIBE", prefixed=True),
        Acl("topic", prefix, "DESCRIBE_CONFIGS", prefixed=True),
    ]


def _processor(t: TopicNames, namespace: str) -> list[Acl]:
    reads = [t.commands, t.activity_results, t.instance_messages]
    reads += [t.state_changelog, t.timer_changelog]
    writes = [t.history, t.status, t.command_outcomes, t.state_changelog, t.timer_changelog]
    writes += [t.instance_messages, t.dead_letters, t.replicas, t.payloads]
    reads += [t.replicas, t.payloads]
    return [
        *(Acl("topic", name, "READ") for name in reads),
        *(Acl("topic", name, "WRITE") for name in writes),
        Acl("topic", t.activity_tasks, "WRITE", prefixed=True),
        Acl("group", f"{namespace}.processor", "READ"),
        Acl("transactional-id", f"{namespace}.processor.", "WRITE", prefixed=True),
        Acl("transactional-id", f"{namespace}.processor.", "DESCRIBE", prefixed=True),
    ]


def _worker(t: TopicNames, namespace: str) -> list[Acl]:
    return [
        Acl("topic", t.activity_tasks, "READ", prefixed=True),
        Acl("topic", t.activity_tasks, "WRITE", prefixed=True),
        Acl("topic", t.activity_results, "WRITE"),
        Acl("topic", t.dead_letters, "WRITE"),
        Acl("topic", t.payloads, "READ"),
        Acl("topic", t.payloads, "WRITE"),
        Acl("group", f"{namespace}.worker", "READ"),
    ]


def _client(t: TopicNames, namespace: str) -> list[Acl]:
    return [
        Acl("topic", t.commands, "WRITE"),
        Acl("topic", t.status, "READ"),
        Acl("topic", t.command_outcomes, "READ"),
        Acl("topic", t.payloads, "READ"),
        Acl("topic", t.payloads, "WRITE"),
    ]


_ROLE_ACLS = {"processor": _processor, "worker": _worker, "client": _client}


def _integration(
    t: TopicNames, namespace: str, publish_topics: Sequence[str], trigger_topics: Sequence[str]
) -> list[Acl]:
    """A processor's extra rules for publishing and triggers (none without them)."""
    acls = [Acl("topic", name, "WRITE") for name in publish_topics]
    if trigger_topics:
        acls += [Acl("topic", name, "READ") for name in trigger_topics]
        acls += [Acl("group", f"{namespace}.triggers", "READ"), Acl("topic", t.commands, "WRITE")]
    return acls


def required_acls(
    namespace: str,
    role: str,
    *,
    publish_topics: Sequence[str] = (),
    trigger_topics: Sequence[str] = (),
) -> list[Acl]:
    """The ACLs ``role`` needs in ``namespace`` (a processor's, with the user topics it
    publishes to and the business topics its triggers read); raises ValueError for an
    unknown role."""
    build = _ROLE_ACLS.get(role)
    if build is None:
        raise ValueError(f"unknown role {role!r}: choose one of {', '.join(ROLES)}")
    names = topic_names(namespace)
    acls = [*_describe_topics(namespace), *build(names, namespace)]
    if role == "processor":
        acls += _integration(names, namespace, publish_topics, trigger_topics)
    return acls


def kafka_acls_commands(
    namespace: str,
    role: str,
    principal: str,
    *,
    publish_topics: Sequence[str] = (),
    trigger_topics: Sequence[str] = (),
) -> list[str]:
    """``kafka-acls.sh`` command lines that grant ``role``'s ACLs to ``principal``
    (``$ADMIN``: ``--bootstrap-server HOST:PORT --command-config admin.properties``)."""
    acls = required_acls(
        namespace, role, publish_topics=publish_topics, trigger_topics=trigger_topics
    )
    return [f"kafka-acls.sh $ADMIN --add {acl.kafka_acls_args(principal)}" for acl in acls]
