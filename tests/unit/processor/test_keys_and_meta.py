"""Table key encodings and the instance row format of the processor."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.codec import MARKER, decode_row
from engine.core.errors import TurnstileError
from engine.core.failure import FailureDetails
from engine.core.history import RuntimeStatus
from engine.core.instance_row import InstanceRow, PendingEvent
from engine.core.messages import IdReusePolicy, StartWorkflow
from engine.core.payloads import Payload, from_payload, to_payload
from engine.services.processor import keys
from engine.services.processor.meta import decode_meta, encode_meta

instance_ids = st.text(
    alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=40,
)
timer_keys = st.builds(
    keys.TimerKey,
    st.integers(0, 2**63 - 1),
    instance_ids,
    st.integers(0, 2**31),
    st.integers(-1, 2**31 - 1),
)


@given(timer_keys)
def test_timer_key_round_trips(key: keys.TimerKey) -> None:
    assert keys.parse_timer_key(keys.timer_key(key)) == key


@given(timer_keys, timer_keys)
def test_timer_keys_sort_by_fire_time(a: keys.TimerKey, b: keys.TimerKey) -> None:
    if a.fire_at_ms < b.fire_at_ms:
        assert keys.timer_key(a) < keys.timer_key(b)


@given(instance_ids, st.integers(0, 2**40), st.integers(0, 2**40))
def test_history_keys_sort_by_sequence_within_an_instance(i: str, s1: int, s2: int) -> None:
    k1, k2 = keys.history_key(i, s1), keys.history_key(i, s2)
    assert (k1 < k2) == (s1 < s2)
    assert k1.startswith(keys.history_prefix(i))
    assert keys.history_sequence(k1) == s1


@given(instance_ids, instance_ids)
def test_history_prefixes_of_different_instances_never_overlap(a: str, b: str) -> None:
    if a != b:
        assert not keys.history_key(a, 0).startswith(keys.history_prefix(b))


@pytest.mark.parametrize("bad", ["", "a\x00b", "x" * 1025])
def test_invalid_instance_ids_are_refused(bad: str) -> None:
    with pytest.raises(TurnstileError, match="invalid instance id"):
        keys.check_instance_id(bad)


payloads = st.none() | st.builds(Payload, st.binary(max_size=20), st.sampled_from(["json", "x"]))
failures = st.recursive(
    st.builds(FailureDetails, st.text(max_size=5), st.text(max_size=5), st.text(max_size=5)),
    lambda inner: st.builds(
        FailureDetails, st.text(max_size=5), st.text(max_size=5), st.just(""), st.booleans(), inner
    ),
    max_leaves=3,
)


@given(
    instance_ids,
    st.none() | st.sampled_from(list(RuntimeStatus)),
    payloads,
    st.none() | failures,
    st.lists(st.builds(PendingEvent, st.text(max_size=5), payloads, st.integers(0, 2**40))),
    st.booleans(),
)
def test_meta_round_trips(
    instance_id: str,
    status: RuntimeStatus | None,
    payload: Payload | None,
    failure: FailureDetails | None,
    pending: list[PendingEvent],
    scheduled: bool,
) -> None:
    start = StartWorkflow(
        instance_id,
        name="wf",
        input=payload,
        reuse_policy=IdReusePolicy.TERMINATE_IF_RUNNING,
        scheduled_start_ms=5,
        tags={"a": "b"},
        parent_instance_id="p",
        parent_generation=1,
        parent_task_id=2,
    )
    meta = InstanceRow(
        instance_id,
        name="wf",
        status=status,
        generation=3,
        input=payload,
        output=payload,
        custom_status=payload,
        failure=failure,
        next_sequence=9,
        generation_start=4,
        last_hash=b"\x01" * 32,
        pending_events=pending,
        scheduled_start=start if scheduled else None,
    )
    assert decode_meta(encode_meta(meta)) == meta


#: A row as the first release wrote it (JSON, format 1), before rows became Avro.
RELEASE_1_ROW = (
    b'{"f":1,"id":"i-1","name":"orders.order","version":"2","status":"PENDING",'
    b'"generation":1,"created":5,"updated":6,"input":["json","eyJhIjoxfQ=="],"output":null,'
    b'"custom":null,"failure":null,"parent":["parent",0,3],"tags":{"k":"v"},'
    b'"request_id":"req","next_seq":7,"gen_start":4,"hash":"AQI=",'
    b'"pending":[["go",["json","Mg=="],9]],"scheduled":{"instance_id":"i-1",'
    b'"name":"orders.order","input":["json","eyJhIjoxfQ=="],"version":"2",'
    b'"reuse_policy":"ERROR_IF_RUNNING","request_id":"req","scheduled_start_ms":1000,'
    b'"tags":{},"parent":[null,null,null]}}'
)


def test_rows_are_avro_instance_rows() -> None:
    data = encode_meta(InstanceRow("a", status=RuntimeStatus.RUNNING))
    assert data[:2] == MARKER
    assert decode_row(data) == InstanceRow("a", status=RuntimeStatus.RUNNING)


def test_rows_of_the_first_release_are_still_read() -> None:
    row = decode_meta(RELEASE_1_ROW)
    assert (row.instance_id, row.status, row.generation) == ("i-1", RuntimeStatus.PENDING, 1)
    assert from_payload(row.input) == {"a": 1} and row.last_hash == b"\x01\x02"
    assert row.pending_events == [PendingEvent("go", to_payload(2), 9)]
    assert row.scheduled_start is not None and row.scheduled_start.scheduled_start_ms == 1000
    assert (row.parent_instance_id, row.parent_generation, row.parent_task_id) == ("parent", 0, 3)
    assert decode_meta(encode_meta(row)) == row
