"""The pure side of large payloads: chunking, references, verification, replay's
comparison by digest and the size limits of references."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import pytest

from engine.core.errors import PayloadTooLargeError
from engine.core.failure import FailureDetails
from engine.core.history import HistoryEvent, TaskCompleted
from engine.core.limits import Limits
from engine.core.messages import ActivityTask
from engine.core.payload_refs import (
    PayloadRef,
    PayloadRefError,
    assemble,
    chunk_key,
    install_fetcher,
    make_ref,
    orphaned_chunks,
    owner_of,
    split_chunks,
)
from engine.core.payloads import (
    Payload,
    describe_payload,
    from_payload,
    is_ref,
    ref_payload,
    same_payload,
    to_payload,
)
from engine.services.large_payloads import PayloadOffloader
from engine.services.worker.runner import ActivityRunner
from engine.ui.source import readable_event


class ChunksInMemory:
    """A fetcher over chunks kept in a dict (what the Kafka store reads from its topic)."""

    def __init__(self) -> None:
        self.chunks: dict[bytes, bytes] = {}

    def put(self, owner: str, payload: Payload, chunk_bytes: int) -> Payload:
        pieces = split_chunks(payload.data, chunk_bytes)
        ref = make_ref(owner, payload.data, payload.encoding, len(pieces), "ns.payloads", 0, 7)
        for key, piece in zip(ref.chunk_keys(), pieces, strict=True):
            self.chunks[key] = piece
        return ref_payload(ref)

    def fetch(self, ref: PayloadRef, count: int | None = None) -> list[bytes]:
        keys = ref.chunk_keys()[: ref.chunks if count is None else count]
        return [self.chunks[k] for k in keys if k in self.chunks]


@pytest.fixture
def store() -> Iterator[ChunksInMemory]:
    fetcher = ChunksInMemory()
    install_fetcher(fetcher)
    yield fetcher
    install_fetcher(None)


def test_chunks_cover_the_data_in_order() -> None:
    assert split_chunks(b"abcdefg", 3) == [b"abc", b"def", b"g"]
    assert split_chunks(b"", 3) == [b""]
    assert chunk_key("i-1", "ab", 2) == b"i-1/ab/2"


def test_a_reference_resolves_to_the_value(store: ChunksInMemory) -> None:
    value = {"text": "x" * 10_000}
    ref = store.put("i-1", to_payload(value), 1000)
    assert is_ref(ref) and len(ref.data) < 400
    assert from_payload(ref) == value
    shown = describe_payload(ref)
    assert shown["large_payload"] == len(to_payload(value).data)
    assert shown["preview"].startswith('{"text":"xxx')


def test_altered_or_missing_chunks_are_refused(store: ChunksInMemory) -> None:
    ref = store.put("i-1", to_payload("y" * 5000), 1000)
    first = next(iter(store.chunks))
    store.chunks[first] = b"z" * 1000
    with pytest.raises(PayloadRefError, match="do not match"):
        from_payload(ref)
    del store.chunks[first]
    with pytest.raises(PayloadRefError, match="do not match"):
        from_payload(ref)


def test_without_a_fetcher_the_error_says_how_to_read_it() -> None:
    ref = make_ref("i-1", b'"v"', "json", 1, "ns.payloads", 0, 0)
    with pytest.raises(PayloadRefError, match="install_fetcher"):
        from_payload(ref_payload(ref))


def test_replay_compares_a_recomputed_value_with_its_reference_by_digest() -> None:
    full = to_payload("w" * 3000)
    ref = ref_payload(make_ref("i-1", full.data, full.encoding, 3, "ns.payloads", 0, 0))
    assert same_payload(full, ref) and same_payload(ref, full)  # no fetcher needed
    assert not same_payload(to_payload("other"), ref)


def test_assemble_checks_the_chunk_count() -> None:
    ref = make_ref("i", b"abcd", "binary", 2, "t", 0, 0)
    assert assemble(ref, [b"ab", b"cd"]) == b"abcd"
    with pytest.raises(PayloadRefError):
        assemble(ref, [b"abcd"])


def test_limits_put_aside_between_the_inline_and_the_largest_size() -> None:
    limits = Limits(payload_inline=100, payload_max=1000)
    assert not limits.kept_aside(Payload(b"x" * 100))
    assert limits.kept_aside(Payload(b"x" * 101))
    with pytest.raises(PayloadTooLargeError, match="payload_max_bytes"):
        limits.kept_aside(Payload(b"x" * 1001))
    big = ref_payload(make_ref("i", b"x" * 2000, "binary", 4, "t", 0, 0))
    with pytest.raises(PayloadTooLargeError, match="payload_max_bytes"):
        limits.check("activity_result", "the activity result", big)
    limits.check(
        "activity_result",
        "the activity result",
        ref_payload(make_ref("i", b"x" * 900, "binary", 2, "t", 0, 0)),
    )
    assert not Limits(payload_inline=0).kept_aside(Payload(b"x" * 10_000))


def test_the_dashboard_shows_a_reference_as_size_and_beginning(store: ChunksInMemory) -> None:
    ref = store.put("i-1", to_payload("v" * 5000), 1000)
    event = HistoryEvent("i-1", 3, 0, 0, TaskCompleted(task_id=1, output=ref))
    body = readable_event(event).body
    assert isinstance(body, TaskCompleted)
    shown = from_payload(body.output)
    assert shown["large_payload"] == 5002 and shown["chunks"] == 6
    assert shown["preview"].startswith('"vvv') and len(shown["preview"]) <= 256


class Written:
    """A payload writer over :class:`ChunksInMemory` (what the Kafka store does on its
    topic), counting what it wrote."""

    def __init__(self, chunks: ChunksInMemory) -> None:
        self.chunks = chunks
        self.writes = 0

    def put(self, owner: str, payload: Payload) -> Payload:
        self.writes += 1
        return self.chunks.put(owner, payload, 1000)


def _run_activity(runner: ActivityRunner, fn: object, value: object) -> tuple[object, object]:
    done: queue.SimpleQueue[tuple[object, object]] = queue.SimpleQueue()
    task = ActivityTask(instance_id="i-1", task_id=1, name="t", input=to_payload(value))
    runner.submit(fn, task, lambda out, failure, _details: done.put((out, failure)))  # type: ignore[arg-type]
    return done.get(timeout=30)


def test_the_worker_puts_a_large_result_aside_and_refuses_one_too_large(
    store: ChunksInMemory,
) -> None:
    writer = Written(store)
    runner = ActivityRunner(2)
    runner.offload = PayloadOffloader(Limits(payload_inline=100, payload_max=5000), writer)

    def repeat(n: int) -> str:
        return "r" * n

    try:
        small, failure = _run_activity(runner, repeat, 10)
        assert failure is None and isinstance(small, Payload) and not is_ref(small)
        large, failure = _run_activity(runner, repeat, 3000)
        assert failure is None and isinstance(large, Payload) and is_ref(large)
        assert from_payload(large) == "r" * 3000
        too_large, failure = _run_activity(runner, repeat, 6000)
        assert too_large is None and isinstance(failure, FailureDetails)
        assert failure.type == "PayloadTooLargeError" and not failure.retryable
        assert writer.writes == 1  # nothing written for the refused one
    finally:
        runner.shutdown()


def test_orphans_are_chunks_of_owners_without_status_past_the_grace() -> None:
    latest = {
        b"gone/ab/0": (1, 100, True),
        b"gone/ab/1": (1, 100, False),  # already a tombstone
        b"live/cd/0": (0, 100, True),
        b"young/ef/0": (0, 900, True),  # a start on its way: no status yet
        b"a/b/c/12/0": (0, 100, True),  # an id with slashes
    }
    assert owner_of(b"a/b/c/12/0") == "a/b/c"
    assert orphaned_chunks(latest, {"live"}, 500) == [(b"gone/ab/0", 1), (b"a/b/c/12/0", 0)]
