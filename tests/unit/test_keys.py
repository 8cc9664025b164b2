"""engine.core.keys must compute exactly what the Java Kafka client computes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.keys import instance_key, murmur2, murmur2_partition, partition_for_instance

# Printed by kafka-clients 4.1.1: Utils.murmur2(bytes) and
# Utils.toPositive(Utils.murmur2(bytes)) % n for n in (1, 3, 12, 32, 100).
JAVA_HASHES: list[tuple[bytes, int, dict[int, int]]] = [
    (b"a", -1563381124, {1: 0, 3: 1, 12: 4, 32: 28, 100: 24}),
    (b"ab", 316155434, {1: 0, 3: 2, 12: 2, 32: 10, 100: 34}),
    (b"abc", 479470107, {1: 0, 3: 0, 12: 3, 32: 27, 100: 7}),
    (b"abcd", -1323649548, {1: 0, 3: 2, 12: 8, 32: 20, 100: 0}),
    (b"abcde", 461995741, {1: 0, 3: 1, 12: 1, 32: 29, 100: 41}),
    (b"order-42", 501153024, {1: 0, 3: 0, 12: 0, 32: 0, 100: 24}),
    (b"instance-0001", 1337002533, {1: 0, 3: 0, 12: 9, 32: 5, 100: 33}),
    (
        b"wf/7f3c2a9e-1b2c-4d5e-8f90-0123456789ab",
        780461423,
        {1: 0, 3: 2, 12: 11, 32: 15, 100: 23},
    ),
    ("héllo-wörld".encode(), 1388409540, {1: 0, 3: 0, 12: 0, 32: 4, 100: 40}),
    (b"turnstile", 739469622, {1: 0, 3: 0, 12: 6, 32: 22, 100: 22}),
    (b"21", -973932308, {1: 0, 3: 0, 12: 0, 32: 12, 100: 40}),
    (b"", 275646681, {}),
    (bytes([0xFF, 0x80, 0x00, 0x01, 0x02, 0xFE, 0x7F]), 346706379, {32: 11}),
]


@pytest.mark.parametrize(("key", "java_hash", "partitions"), JAVA_HASHES)
def test_murmur2_matches_java(key: bytes, java_hash: int, partitions: dict[int, int]) -> None:
    assert murmur2(key) == java_hash
    for count, java_partition in partitions.items():
        assert murmur2_partition(key, count) == java_partition


def test_instance_key_is_utf8_and_partition_follows_it() -> None:
    assert instance_key("héllo-wörld") == "héllo-wörld".encode()
    assert partition_for_instance("héllo-wörld", 32) == 4
    assert partition_for_instance("order-42", 100) == 24


@pytest.mark.parametrize("count", [0, -1])
def test_partition_count_must_be_positive(count: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        murmur2_partition(b"k", count)


@given(st.binary(max_size=64))
def test_hash_is_a_signed_32_bit_int(key: bytes) -> None:
    assert -(2**31) <= murmur2(key) < 2**31


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_partition_is_in_range_and_deterministic(key: bytes, count: int) -> None:
    partition = murmur2_partition(key, count)
    assert 0 <= partition < count
    assert murmur2_partition(bytes(key), count) == partition


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=1_000))
def test_partition_masks_the_sign_bit_like_java_to_positive(key: bytes, count: int) -> None:
    # Java uses toPositive (n & 0x7fffffff), not abs(): the two differ for negative hashes.
    assert murmur2_partition(key, count) == (murmur2(key) & 0x7FFFFFFF) % count


@given(st.text(max_size=40))
def test_partition_for_instance_uses_the_utf8_key(instance_id: str) -> None:
    assert partition_for_instance(instance_id, 32) == murmur2_partition(
        instance_id.encode("utf-8"), 32
    )
