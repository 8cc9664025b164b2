"""Which processor replicas are alive, as their liveness records say, and who acts on a
silent one.

Each replica writes a liveness record every ``liveness_interval_ms`` and reads everyone's
(:mod:`engine.adapters.kafka.liveness`). A peer not heard for ``liveness_timeout_ms`` is
taken for dead; one replica - the lowest replica id among those alive, so that two never
race for the same peer - then has it evicted from the consumer group at once, instead of
waiting out the group's session timeout. Times are this replica's own monotonic clock at
the moment a record was read, so clocks that differ between machines do not matter.

Pure bookkeeping, no I/O: the adapter feeds it what it reads and asks it what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Peers"]


@dataclass
class Peers:
    """The peers one replica has heard, and when."""

    me: str
    timeout_s: float
    #: Replica id -> when it was last heard (monotonic seconds).
    heard_at: dict[str, float] = field(default_factory=dict)
    #: Peers already acted on; they are not acted on again until heard again.
    acted: set[str] = field(default_factory=set)

    def heard(self, replica: str, now: float) -> None:
        """A liveness record of ``replica`` was read."""
        if replica != self.me:
            self.heard_at[replica] = now
            self.acted.discard(replica)

    def left(self, replica: str) -> None:
        """``replica`` stopped cleanly (it left the group itself): forget it."""
        self.heard_at.pop(replica, None)
        self.acted.discard(replica)

    def alive(self, now: float) -> set[str]:
        """The peers heard within the timeout."""
        # a copy: the standbys' thread asks while the liveness thread writes
        return {r for r, at in list(self.heard_at.items()) if now - at <= self.timeout_s}

    def to_act_on(self, now: float) -> list[str]:
        """The silent peers this replica must act on now: none unless it is the lowest
        replica id among those alive (itself included)."""
        silent = sorted(set(self.heard_at) - self.alive(now) - self.acted)
        if not silent or min(self.alive(now) | {self.me}) != self.me:
            return []
        return silent

    def acted_on(self, replica: str) -> None:
        """``replica`` was evicted (or found gone already)."""
        self.acted.add(replica)

    def silent_for(self, replica: str, now: float) -> float:
        return now - self.heard_at.get(replica, now)
