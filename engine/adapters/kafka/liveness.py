"""Replicas watch each other and evict a crashed one from the group in about a second and a
half, instead of the group's session timeout.

A processor replica is a static member of its consumer group (``group.instance.id`` = its
replica id), so that a replica that restarts gets its partitions back without a rebalance.
The price is that a replica that dies without leaving keeps its partitions, idle, until its
session times out (10 s). Here every replica writes a liveness record to the
``<namespace>.replicas`` topic (compacted, one partition; key: the replica id, value: its
consumer's ``client.id``; a tombstone when it stops cleanly) every ``liveness_interval_ms``
from a thread of its own, so a long turn does not silence it, and reads everyone's. When a
peer is silent for ``liveness_timeout_ms`` and is still a member of the group, the lowest
live replica (:class:`engine.services.processor.liveness.Peers`) takes the silent one's place
in the group - a consumer joining under the same ``group.instance.id`` replaces the old member
at once, fencing it at the coordinator - and leaves the group with it, so its partitions move
to the survivors now. The survivors then fence its transactional id before restoring
(:mod:`engine.adapters.kafka.fencing`), so whatever it left open is aborted at once.

A replica that was only stalled (a paused process, a machine that stopped answering) and is
evicted is fenced like a crashed one and can never commit again: when it wakes, its producer
is fenced and it rejoins as after any recovery. Set ``liveness_timeout_ms`` well above the
longest stall a healthy replica may have: a false alarm costs one rebalance and one
recovery, not correctness. The session timeout stays the backstop when the liveness topic
is unreachable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from engine.adapters.kafka.config import (
    KafkaConfig,
    admin_config,
    consumer_config,
    group_membership,
    producer_config,
)
from engine.adapters.kafka.io import leave_group
from engine.config.settings import Settings
from engine.services.processor.liveness import Peers

__all__ = ["LivenessWatch"]

log = logging.getLogger("engine.processor")

#: How often a peer's silence is checked between this replica's own records.
CHECK_S = 0.1
#: How long taking a silent replica's place in the group may take before giving up.
EVICT_TIMEOUT_S = 10.0


class LivenessWatch:
    """One replica's liveness records and its watch over its peers, on a thread."""

    def __init__(
        self,
        settings: Settings,
        topic: str,
        member: str,
        inputs: Sequence[str],
        group_consumer: KafkaConfig,
    ) -> None:
        self.settings = settings
        self.topic = topic
        self.member = member
        self.inputs = list(inputs)
        #: The replica's own group consumer settings, to join as a silent peer.
        self.group_consumer = group_consumer
        self.interval_s = settings.liveness_interval_ms / 1000
        self.peers = Peers(settings.replica_id, settings.liveness_timeout_ms / 1000)
        self.evicted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._producer = Producer(
            producer_config(settings.bootstrap_servers, client_id=member) | settings.extra_kafka
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, left: bool) -> None:
        """Stop the thread; ``left``: the replica left the group cleanly, so say so."""
        self._stop.set()
        self._thread.join(timeout=EVICT_TIMEOUT_S + 5)
        if left:
            self._producer.produce(self.topic, key=self.settings.replica_id.encode(), value=None)
        self._producer.flush(5)

    def _run(self) -> None:
        try:
            consumer = self._reader()
        except KafkaException as exc:
            log.warning("liveness: cannot read %s (%s); peers are not watched", self.topic, exc)
            return
        try:
            while not self._stop.is_set():
                self._beat()
                self._watch(consumer, time.monotonic() + self.interval_s)
        finally:
            consumer.close()

    def _reader(self) -> Consumer:
        config = consumer_config(
            self.settings.bootstrap_servers,
            f"{self.settings.processor_group}.liveness",
            client_id=self.member,
            **{"fetch.wait.max.ms": 100},
        )
        consumer = Consumer(config | self.settings.extra_kafka)
        # From the beginning: a replica that starts learns of every peer, a dead one too (its
        # last record counts as heard now; if it stays silent and is still a member, it is
        # evicted like one that died while watched).
        consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        return consumer

    def _beat(self) -> None:
        try:
            key = self.settings.replica_id.encode()
            self._producer.produce(self.topic, key=key, value=self.member.encode())
            self._producer.poll(0)
        except (KafkaException, BufferError) as exc:
            log.warning("liveness: could not write this replica's record: %s", exc)

    def _watch(self, consumer: Consumer, until: float) -> None:
        """Read peers' records until ``until``, acting on a silent peer as soon as its
        silence passes the timeout (checked every :data:`CHECK_S`)."""
        while (left := until - time.monotonic()) > 0 and not self._stop.is_set():
            for replica in self.peers.to_act_on(time.monotonic()):
                self._act_on(replica)
            message = consumer.poll(min(left, CHECK_S))
            key = None if message is None or message.error() is not None else message.key()
            if message is None or key is None:
                continue
            replica = bytes(key).decode(errors="replace")
            if message.value() is None:
                self.peers.left(replica)
            else:
                self.peers.heard(replica, time.monotonic())

    def _act_on(self, replica: str) -> None:
        silent = self.peers.silent_for(replica, time.monotonic())
        self.peers.acted_on(replica)
        try:
            if not self._is_member(replica):
                return
            self._evict(replica)
        except KafkaException as exc:
            log.warning("liveness: could not evict replica %s: %s", replica, exc)
            return
        self.evicted += 1
        log.warning(
            "replica %s silent for %.1fs: evicted from the group, its partitions move now",
            replica,
            silent,
        )

    def _is_member(self, replica: str) -> bool:
        settings = self.settings
        admin = AdminClient(admin_config(settings.bootstrap_servers) | settings.extra_kafka)
        (future,) = admin.describe_consumer_groups([self.settings.processor_group]).values()
        members = future.result(timeout=EVICT_TIMEOUT_S).members
        return any(m.group_instance_id == replica for m in members)

    def _evict(self, replica: str) -> None:
        """Join as ``replica`` (the coordinator replaces its member at once) and leave."""
        config = dict(self.group_consumer)
        config.update(group_membership(replica))
        config["client.id"] = f"{self.member}.evicting.{replica}"
        consumer = Consumer(config)
        joined = threading.Event()
        try:
            consumer.subscribe(self.inputs, on_assign=lambda _c, _p: joined.set())
            deadline = time.monotonic() + EVICT_TIMEOUT_S
            while not joined.is_set() and time.monotonic() < deadline:
                consumer.poll(0.05)  # records fetched meanwhile are dropped, never committed
            if not joined.is_set():
                raise KafkaException(f"the group did not let this replica in as {replica}")
            leave_group(consumer)
        finally:
            consumer.close()
