"""Large payloads kept beside the history: the reference that stands in for them, how they
are cut into chunks and how the chunks are checked when they come back.

Why: a record has a size limit (the broker's ``message.max.bytes``, about 1 MB), but a user
with a 40 MB report still needs to run the workflow. A payload larger than
``payload_inline_max_bytes`` is therefore written as chunks to the ``<namespace>.payloads``
topic (compacted, on its instance's partition) and the record that carries it - the start
command, the activity result - holds a small *reference* instead: a payload of encoding
:data:`REF_ENCODING` whose bytes are the JSON of a :class:`PayloadRef` (size, SHA-256, chunk
count, where the chunks are). The reference moves through history, state and status like any
small payload; only the code that decodes the value fetches the chunks (:func:`resolve`),
checks size and digest, and gets the stored payload back.

Pure: the process's :class:`PayloadFetcher` (the Kafka adapter, installed with
:func:`install_fetcher`) does the reading; the writing is done by the adapter that produces
the record carrying the reference.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Protocol

from engine.core.errors import CodecError, TurnstileError
from engine.core.payload_codecs import CHAIN_MARK

#: Encoding of a payload that stands for one kept in chunks on the payloads topic.
REF_ENCODING = "turnstile.ref"

#: Bytes per chunk: well below the broker's default ``message.max.bytes`` (1 MB) and the
#: producer's, so a chunk never needs a topic or client setting raised.
CHUNK_BYTES = 512 * 1024

#: Payloads above this many bytes go to the payloads topic by default.
DEFAULT_INLINE_MAX = 128 * 1024

#: The largest payload by default (``payload_max_bytes``).
DEFAULT_PAYLOAD_MAX = 64 * 1024 * 1024


class PayloadRefError(CodecError):
    """A reference cannot be resolved: chunks missing (purged), altered, or no way to read
    them in this process."""


@dataclass(frozen=True, slots=True)
class PayloadRef:
    """Where a large payload's chunks are and how to check them.

    ``owner`` is the instance whose partition holds the chunks (their keys start with it),
    ``offset`` the offset of the first chunk on that partition: the chunks follow it, in
    order, keyed ``<owner>/<sha256>/<i>`` (:func:`chunk_key`).
    """

    owner: str
    size: int
    sha256: str
    chunks: int
    #: The stored payload's own encoding (its codec chain included).
    encoding: str
    topic: str
    partition: int
    offset: int

    def chunk_keys(self) -> list[bytes]:
        """The record keys of the chunks, in order."""
        return [chunk_key(self.owner, self.sha256, i) for i in range(self.chunks)]


def chunk_key(owner: str, sha256: str, index: int) -> bytes:
    """The key of chunk ``index``: equal payloads of one instance share their chunks (a
    retried write replaces them instead of adding copies), and the instance id comes
    first, so purge finds them by prefix."""
    return f"{owner}/{sha256}/{index}".encode()


def owner_prefix(owner: str) -> bytes:
    """What every chunk key of ``owner`` starts with."""
    return f"{owner}/".encode()


def split_chunks(data: bytes, chunk_bytes: int = CHUNK_BYTES) -> list[bytes]:
    """``data`` cut into chunks of at most ``chunk_bytes`` (at least one, even if empty)."""
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be positive")
    return [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)] or [b""]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_ref(
    owner: str, data: bytes, encoding: str, chunks: int, topic: str, partition: int, offset: int
) -> PayloadRef:
    """The reference to stored ``data`` of ``encoding`` once its ``chunks`` are written
    from ``offset`` on."""
    owner = str(owner)  # an instance handle is a str with more to it
    return PayloadRef(owner, len(data), digest(data), chunks, encoding, topic, partition, offset)


def ref_bytes(ref: PayloadRef) -> bytes:
    """The bytes of the small payload (of :data:`REF_ENCODING`) that carries ``ref``."""
    return json.dumps(asdict(ref), sort_keys=True).encode()


def parse_ref(data: bytes) -> PayloadRef:
    """The reference the bytes of a :data:`REF_ENCODING` payload carry."""
    try:
        doc = json.loads(data)
        return PayloadRef(**doc)
    except (ValueError, TypeError) as exc:
        raise PayloadRefError(f"malformed payload reference: {exc}") from None


def assemble(ref: PayloadRef, chunks: list[bytes]) -> bytes:
    """The stored payload from its chunks, checked against the reference (so a chunk that
    was altered, cut or replaced never reaches workflow code)."""
    data = b"".join(chunks)
    if len(chunks) != ref.chunks or len(data) != ref.size or digest(data) != ref.sha256:
        raise PayloadRefError(
            f"the chunks of payload {ref.sha256[:12]} of instance {ref.owner!r} do not match "
            f"its reference ({len(chunks)} chunks, {len(data)} bytes; expected {ref.chunks} "
            f"chunks, {ref.size} bytes and the recorded SHA-256)"
        )
    return data


class PayloadFetcher(Protocol):
    """Reads the chunks of a reference (``count`` first ones; None: all), in order."""

    def fetch(self, ref: PayloadRef, count: int | None = None) -> list[bytes]: ...


_FETCHER: list[PayloadFetcher | None] = [None]


def install_fetcher(fetcher: PayloadFetcher | None) -> None:
    """Make ``fetcher`` the one this process reads references with (process-wide, like
    codecs: every decoder of payloads needs it)."""
    _FETCHER[0] = fetcher


def fetch_stored(ref: PayloadRef) -> bytes:
    """The stored bytes ``ref`` stands for, read and checked."""
    return assemble(ref, _fetcher(ref).fetch(ref))


def preview(ref: PayloadRef, limit: int = 256) -> bytes:
    """The first ``limit`` stored bytes of a reference's payload (one chunk read), for
    display: a dashboard shows size and beginning, never fetches 64 MiB to list a row."""
    return b"".join(_fetcher(ref).fetch(ref, 1))[:limit]


def describe_ref(ref: PayloadRef) -> dict[str, object]:
    """A reference for display: size, digest, chunks and - when this process can read
    them and the payload has no codec chain - the beginning of the value."""
    doc: dict[str, object] = {
        "large_payload": ref.size,
        "encoding": ref.encoding,
        "sha256": ref.sha256,
        "chunks": ref.chunks,
    }
    if _FETCHER[0] is not None and CHAIN_MARK not in ref.encoding:
        try:
            doc["preview"] = preview(ref).decode("utf-8", "replace")
        except TurnstileError as exc:  # gone, or the broker away: a listing goes on
            doc["unreadable"] = str(exc)
    return doc


def _fetcher(ref: PayloadRef) -> PayloadFetcher:
    fetcher = _FETCHER[0]
    if fetcher is None:
        raise PayloadRefError(
            f"payload {ref.sha256[:12]} ({ref.size} bytes) is kept on topic {ref.topic}, and "
            f"this process has no reader for it: read it through engine.client.Client or "
            f"a turnstile command (they install one), or call "
            f"engine.core.payload_refs.install_fetcher()"
        )
    return fetcher


def owner_of(key: bytes) -> str:
    """The instance a chunk key belongs to (``<owner>/<sha256>/<i>``)."""
    return key.decode("utf-8", "replace").rsplit("/", 2)[0]


def orphaned_chunks(
    latest: dict[bytes, tuple[int, int, bool]], live: set[str], before_ms: int
) -> list[tuple[bytes, int]]:
    """The (key, partition) of chunks nothing can need: ``latest`` maps each chunk key to
    (partition, timestamp ms, whether its newest record is a value, not a tombstone); a
    chunk whose owner has no status any more (purged, or never started) and that was
    written before ``before_ms`` (a start whose command is still on its way has no status
    yet) is an orphan."""
    return [
        (key, partition)
        for key, (partition, written_ms, alive) in latest.items()
        if alive and written_ms < before_ms and owner_of(key) not in live
    ]
