"""Record keys and the partition they map to, exactly as the Java Kafka client computes it.

Every topic of the engine is keyed by instance ID and partitioned with Java's murmur2, so
that a record produced by a Java, Go or Python producer for the same instance lands on the
same partition (librdkafka does this when configured with ``partitioner=murmur2_random``).
This pure implementation lets the engine, its tests and auditors predict that partition
without a producer, and cross-check the client library against the Java algorithm.
"""

from __future__ import annotations

__all__ = ["instance_key", "murmur2", "murmur2_partition", "partition_for_instance"]

_MASK32 = 0xFFFFFFFF
_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24


def _to_signed32(value: int) -> int:
    """Reinterpret an unsigned 32-bit value as Java's signed ``int``."""
    value &= _MASK32
    return value - (1 << 32) if value & 0x80000000 else value


def murmur2(data: bytes) -> int:
    """Java's ``org.apache.kafka.common.utils.Utils.murmur2``: a signed 32-bit hash.

    Arithmetic is done on unsigned 32-bit values, which gives the same bits as Java's
    wrapping ``int`` arithmetic; ``>>>`` (logical shift) is a plain shift on unsigned values.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = length % 4
    if tail:
        # Java falls through the switch: case 3, then case 2, then case 1 (which multiplies).
        if tail == 3:
            h ^= data[whole + 2] << 16
        if tail >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return _to_signed32(h)


def murmur2_partition(key: bytes, num_partitions: int) -> int:
    """The partition the Java producer's default partitioner picks for a non-null ``key``.

    That is ``Utils.toPositive(Utils.murmur2(key)) % numPartitions``; ``toPositive`` masks
    the sign bit (it is not ``abs``), so the result is always in ``[0, num_partitions)``.
    """
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


def instance_key(instance_id: str) -> bytes:
    """The record key for an instance: its ID encoded as UTF-8, on every topic."""
    return instance_id.encode("utf-8")


def partition_for_instance(instance_id: str, num_partitions: int) -> int:
    """The partition that holds everything about ``instance_id`` on every engine topic."""
    return murmur2_partition(instance_key(instance_id), num_partitions)
