"""Replicas acting on a silent peer: exactly one acts (the lowest replica id alive), once per
silence, and a peer heard again or gone cleanly is left alone."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.services.processor.liveness import Peers

TIMEOUT = 1.5


def test_a_silent_peer_is_acted_on_once_by_the_lowest_replica() -> None:
    low, high = Peers("p-0", TIMEOUT), Peers("p-2", TIMEOUT)
    for peers in (low, high):
        for replica in ("p-0", "p-1", "p-2"):
            peers.heard(replica, 0.0)
    assert low.to_act_on(1.0) == [] and high.to_act_on(1.0) == []
    for peers in (low, high):
        peers.heard("p-0", 2.0)
        peers.heard("p-2", 2.0)
    assert low.to_act_on(2.0) == ["p-1"]
    assert high.to_act_on(2.0) == []  # p-0 is alive and lower: it acts
    low.acted_on("p-1")
    assert low.to_act_on(3.0) == []
    low.heard("p-1", 3.5)  # it came back: a later silence counts again
    low.heard("p-2", 3.5)
    assert low.to_act_on(3.6) == []
    low.heard("p-2", 5.0)
    assert low.to_act_on(5.1) == ["p-1"]


def test_a_peer_that_left_cleanly_is_not_acted_on() -> None:
    peers = Peers("p-0", TIMEOUT)
    peers.heard("p-1", 0.0)
    peers.left("p-1")
    assert peers.to_act_on(10.0) == []


@given(
    replicas=st.sets(st.sampled_from([f"p-{i}" for i in range(6)]), min_size=2),
    silent=st.sets(st.sampled_from([f"p-{i}" for i in range(6)])),
)
def test_exactly_one_live_replica_acts(replicas: set[str], silent: set[str]) -> None:
    silent &= replicas
    live = replicas - silent
    views = {r: Peers(r, TIMEOUT) for r in live}
    for peers in views.values():
        for r in replicas:
            peers.heard(r, 0.0)
        for r in live:
            peers.heard(r, 10.0)
    acting = {r: p.to_act_on(10.0) for r, p in views.items() if p.to_act_on(10.0)}
    if silent and live:
        assert list(acting) == [min(live)]
        assert acting[min(live)] == sorted(silent)
    else:
        assert acting == {}
