"""The owner stamp on committed offsets (engine.adapters.kafka.fencing) reads back what was
written, and offsets committed without one name no owner."""

from __future__ import annotations

from confluent_kafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from engine.adapters.kafka.fencing import owners, stamped

#: Kafka client and transactional ids: text without control characters.
ids = st.text(st.characters(exclude_categories=("Cc", "Cs")), min_size=1, max_size=40).filter(
    lambda s: " member=" not in s
)


@given(transactional_id=ids, member=ids, offsets=st.lists(st.integers(0, 2**40), max_size=5))
def test_stamped_offsets_name_their_owner(
    transactional_id: str, member: str, offsets: list[int]
) -> None:
    positions = [TopicPartition("t", p, o) for p, o in enumerate(offsets)]
    marked = stamped(positions, transactional_id, member)
    assert [(tp.partition, tp.offset) for tp in marked] == [(p, o) for p, o in enumerate(offsets)]
    assert owners(marked) == ({transactional_id: member} if offsets else {})


def test_offsets_without_a_stamp_name_no_owner() -> None:
    plain = [TopicPartition("t", 0, 5), TopicPartition("t", 1, 7, metadata="from a tool")]
    assert owners(plain) == {}
