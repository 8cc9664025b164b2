"""Which partitions a replica stands by for: the range assignor's answer when peers leave."""

from __future__ import annotations

from engine.services.processor.standby import range_assignment, standby_partitions


def test_range_gives_the_first_members_one_more_each() -> None:
    assert range_assignment(["b", "a", "c"], 8) == {
        "a": [0, 1, 2],
        "b": [3, 4, 5],
        "c": [6, 7],
    }


def test_members_sort_by_id_as_bytes_not_by_arrival() -> None:
    # "processor-10" sorts before "processor-2", as librdkafka compares the ids' bytes
    assert range_assignment(["processor-2", "processor-10"], 4) == {
        "processor-10": [0, 1],
        "processor-2": [2, 3],
    }


def test_more_members_than_partitions_leaves_the_last_ones_empty() -> None:
    assert range_assignment(["a", "b", "c"], 2) == {"a": [0], "b": [1], "c": []}
    assert range_assignment([], 4) == {}


def test_one_standby_covers_every_partition_exactly_once() -> None:
    members = ["r0", "r1", "r2"]
    partitions = 12
    owned = range_assignment(members, partitions)
    standing = {m: standby_partitions(m, members, partitions, 1) for m in members}
    for member in members:
        assert not standing[member] & set(owned[member])
    # every partition has exactly one standby: the replica that gets it when its owner dies
    for p in range(partitions):
        holders = [m for m in members if p in standing[m]]
        assert len(holders) == 1, (p, holders)
        (owner,) = [m for m in members if p in owned[m]]
        after = range_assignment(set(members) - {owner}, partitions)
        assert p in after[holders[0]]


def test_the_standby_is_the_replica_that_takes_the_partition() -> None:
    # two replicas: each stands by for all of the other's partitions
    assert standby_partitions("r0", ["r0", "r1"], 4, 1) == {2, 3}
    assert standby_partitions("r1", ["r0", "r1"], 4, 1) == {0, 1}


def test_no_standbys_and_no_peers_mean_no_copies() -> None:
    assert standby_partitions("r0", ["r0", "r1", "r2"], 12, 0) == set()
    assert standby_partitions("r0", [], 12, 1) == set()


def test_two_standbys_cover_two_peers_leaving_together() -> None:
    members = ["r0", "r1", "r2"]
    two = standby_partitions("r0", members, 12, 2)
    # with both peers gone r0 owns everything: it stands by for all it does not own
    assert two == set(range(12)) - set(range_assignment(members, 12)["r0"])
    assert standby_partitions("r0", members, 12, 1) <= two
