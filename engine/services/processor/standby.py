"""Which partitions a replica keeps a warm copy of: the ones it would take over.

A standby copy only helps the replica that is given the partition when its owner dies, and
the group's assignor, not the engine, decides who that is: librdkafka's ``range`` assignor
(the processor's three input topics must stay co-partitioned, see ARCHITECTURE.md), whose
choice cannot be steered from Python. So instead of choosing a standby and hoping the
assignor agrees, each replica predicts the assignor: for every set of at most
``standby_replicas`` peers that could die together, it computes what the range assignor would
give the survivors, and keeps copies of the partitions it would gain.

The prediction follows librdkafka's range assignor (``rdkafka_range_assignor.c``): per topic,
members sorted by ``group.instance.id`` when both are static members
(``rd_kafka_group_member_cmp``: byte order of the ids, which for UTF-8 is Python's string
order), then member *i* of *n* gets ``partitions // n`` consecutive partitions starting at
``(partitions // n) * i + min(i, partitions % n)``, one more for the first ``partitions % n``
members. The three input topics have the same partition count, so every topic gives the
same answer. A wrong guess (a peer not yet in the group, one the liveness records have not
shown yet) costs only a longer restore on the next takeover: the new owner restores from
whatever its local copy holds, as before.

Pure: members and partition counts in, partition numbers out.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import combinations

__all__ = ["range_assignment", "standby_partitions"]


def range_assignment(members: Iterable[str], partitions: int) -> dict[str, list[int]]:
    """What librdkafka's range assignor gives each static member (by ``group.instance.id``)
    of one topic with ``partitions`` partitions."""
    ordered = sorted(set(members))
    if not ordered:
        return {}
    each, extra = divmod(partitions, len(ordered))
    assignment = {}
    for i, member in enumerate(ordered):
        start = each * i + min(i, extra)
        assignment[member] = list(range(start, start + each + (1 if i < extra else 0)))
    return assignment


def standby_partitions(me: str, members: Iterable[str], partitions: int, standbys: int) -> set[int]:
    """The partitions ``me`` keeps warm copies of: every partition it would be given if any
    ``standbys`` or fewer of the other ``members`` left the group at once, and does not own now.

    With ``standbys = 1`` each partition has exactly one standby, the replica the range
    assignor hands it to when its owner dies.
    """
    group = set(members) | {me}
    peers = sorted(group - {me})
    owned = set(range_assignment(group, partitions).get(me, []))
    wanted: set[int] = set()
    for size in range(1, min(standbys, len(peers)) + 1):
        for gone in combinations(peers, size):
            survivors = group - set(gone)
            wanted.update(range_assignment(survivors, partitions)[me])
    return wanted - owned
