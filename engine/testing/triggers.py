"""The test engine's trigger bridge: records on trigger topics become commands.

The Kafka bridge (``engine/adapters/kafka/triggers.py``) reads each trigger topic and
writes, for every record, the ``StartWorkflow`` or ``RaiseEvent`` command it asks for or a
dead letter with the reason. This does the same over the in-memory topics, with the same
pure mapping (``engine/services/triggers.py``), so a test checks the mapping the processor
will run: each record is routed once, in offset order per partition, on the engine's next
round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from engine.config.topics import TopicNames
from engine.config.triggers import Trigger
from engine.services.triggers import Outgoing, route
from engine.testing.topics import MemoryTopics


class MemoryTriggerBridge:
    """Routes the new records of every trigger topic (what the bridge's consumer group has
    not read yet), remembering how far it read each partition."""

    def __init__(
        self, triggers: Iterable[Trigger], topics: TopicNames, max_record_bytes: int
    ) -> None:
        self._triggers = {t.topic: t for t in triggers}
        self._topics = topics
        self._max_record_bytes = max_record_bytes
        self._read: dict[tuple[str, int], int] = {}
        #: Records turned into commands and into dead letters, as the Kafka bridge counts.
        self.mapped = 0
        self.dead_letters = 0

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(self._triggers)

    def step(self, log: MemoryTopics, write: Callable[[Outgoing], None]) -> int:
        """Route every record not routed yet; returns how many there were."""
        routed = 0
        for topic, trigger in self._triggers.items():
            for partition in range(log.partitions):
                start = self._read.get((topic, partition), 0)
                for record in log.read_partition(topic, partition, start):
                    out = route(
                        trigger,
                        record,
                        self._topics.commands,
                        self._topics.dead_letters,
                        self._max_record_bytes,
                    )
                    write(out)
                    dead = out.topic == self._topics.dead_letters
                    self.dead_letters += dead
                    self.mapped += not dead
                    self._read[(topic, partition)] = record.offset + 1
                    routed += 1
        return routed
