"""Hash-chain verification over raw history records, naming the first broken link.

Each event's hash is SHA-256 over its own encoded bytes up to the hash field, and those
bytes include the previous event's hash; the first event of an instance links to nothing
(an empty hash) and sequence numbers run from 0 without gaps. So:

- changing any byte of an event breaks its own hash (**altered**);
- changing an event and re-hashing it breaks the link of the event after it (**altered**);
- removing events leaves a gap in the sequence numbers (**missing**);
- moving an event leaves a gap that the moved event fills later (**reordered**);
- repeating an event brings a sequence number back that was already passed (**duplicated**).

The verifier is streaming (records of many instances may be interleaved, as on a topic
partition) and keeps only a few values per instance. What it cannot see alone: that the
*last* events of an instance were removed; ``audit state`` compares the chain's tail with
the processor's state for that.

A purge removes an instance's state but not its history; a later start of the same id
begins a new chain at sequence 0. A new event at sequence 0 that links to nothing is
therefore accepted as the start of a new lifetime, not reported as a break (a copy of an
earlier first event is still a duplicate).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.codec import decode_history, encode_history, history_hash_ok
from engine.core.errors import CodecError
from engine.core.history import HistoryEvent

__all__ = [
    "ALTERED",
    "DUPLICATED",
    "MISSING",
    "REORDERED",
    "ChainBreak",
    "ChainResult",
    "ChainVerifier",
    "verify_events",
    "verify_records",
]

ALTERED = "altered"
MISSING = "missing"
REORDERED = "reordered"
DUPLICATED = "duplicated"

_MAX_GAP = 100_000
"""Sequence numbers remembered as missing per instance (a bound on memory for absurd gaps)."""

UNKNOWN_INSTANCE = "<unknown>"


def _short(digest: bytes) -> str:
    return digest.hex()[:16] if digest else "nothing"


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """The first link of an instance's chain that does not hold."""

    instance_id: str
    sequence: int
    kind: str
    detail: str
    #: Index of the offending record among this instance's records (0 = its first).
    position: int

    def to_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "sequence": self.sequence,
            "kind": self.kind,
            "detail": self.detail,
            "position": self.position,
        }


@dataclass(slots=True)
class ChainResult:
    """One instance's verdict: how much was checked and the first break, if any."""

    instance_id: str
    events: int = 0
    first_sequence: int = -1
    last_sequence: int = -1
    last_hash: bytes = b""
    #: How many times the chain started over at sequence 0 (purge, then a new start).
    restarts: int = 0
    partial: bool = False
    broken: ChainBreak | None = None
    # --- where the verifier stands in this chain (not part of the verdict) ---
    #: The sequence the next event should have.
    expected_sequence: int = field(default=0, repr=False, compare=False)
    #: Sequences skipped so far (one turning up later is reordered, not duplicated).
    gaps: set[int] = field(default_factory=set, repr=False, compare=False)
    #: The sequence range of the first break when it is a gap (it may turn out reordered).
    first_gap: tuple[int, int] = field(default=(-1, -1), repr=False, compare=False)
    #: Hashes of the events that started a chain (a copy of one is a duplicate, not a restart).
    start_hashes: set[bytes] = field(default_factory=set, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.broken is None

    def to_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "ok": self.ok,
            "events": self.events,
            "first_sequence": self.first_sequence,
            "last_sequence": self.last_sequence,
            "last_hash": self.last_hash.hex(),
            "restarts": self.restarts,
            "partial": self.partial,
            "break": None if self.broken is None else self.broken.to_json(),
        }


class ChainVerifier:
    """Feed an instance's records in the order they were written; read :meth:`results`.

    ``partial=True`` accepts a chain that starts after sequence 0 (an export of a time
    range): its first event's link is taken on trust, everything after it is checked.
    """

    def __init__(self, *, partial: bool = False) -> None:
        self.partial = partial
        self._chains: dict[str, ChainResult] = {}

    def feed(self, data: bytes, instance_hint: str | None = None) -> None:
        """Check one encoded history record (``instance_hint``: its key, if known)."""
        try:
            event = decode_history(data)
        except CodecError as exc:
            self._undecodable(instance_hint or UNKNOWN_INSTANCE, exc)
            return
        chain = self._chain(event)
        chain.events += 1
        if not history_hash_ok(data):
            self._altered_bytes(chain, event)
        else:
            self._link(chain, event)
        chain.last_sequence = max(chain.last_sequence, event.sequence)

    def results(self) -> list[ChainResult]:
        """Every instance seen, in order of first appearance."""
        return list(self._chains.values())

    # --- per record -------------------------------------------------------------------------

    def _chain(self, event: HistoryEvent) -> ChainResult:
        chain = self._chains.get(event.instance_id)
        if chain is None:
            chain = ChainResult(event.instance_id, first_sequence=event.sequence)
            if self.partial and event.sequence > 0:
                chain.partial = True
                chain.expected_sequence = event.sequence
                chain.last_hash = event.previous_hash
            self._chains[event.instance_id] = chain
        return chain

    def _undecodable(self, instance_id: str, exc: CodecError) -> None:
        chain = self._chains.setdefault(instance_id, ChainResult(instance_id))
        chain.events += 1
        self._break(
            chain, chain.expected_sequence, ALTERED, f"a record is not a valid history event: {exc}"
        )

    def _altered_bytes(self, chain: ChainResult, event: HistoryEvent) -> None:
        why = (
            "it carries no hash (it was never sealed by the processor)"
            if not event.hash
            else "its bytes do not match its hash: it was changed after it was written"
        )
        self._break(chain, event.sequence, ALTERED, f"event #{event.sequence}: {why}")
        self._advance(chain, event)

    def _link(self, chain: ChainResult, event: HistoryEvent) -> None:
        seq = event.sequence
        if seq == chain.expected_sequence:
            if event.previous_hash != chain.last_hash:
                self._break(
                    chain,
                    seq,
                    ALTERED,
                    f"event #{seq} links to {_short(event.previous_hash)}, but the event before "
                    f"it has hash {_short(chain.last_hash)}: an earlier event was changed and "
                    f"re-hashed, or this one was put in place of the original",
                )
            self._advance(chain, event)
        elif seq == 0 and not event.previous_hash and event.hash not in chain.start_hashes:
            chain.restarts += 1  # purged, then started again: a new chain
            chain.expected_sequence, chain.gaps = 0, set()
            self._advance(chain, event)
        elif seq > chain.expected_sequence:
            self._gap(chain, event)
        elif seq in chain.gaps:
            chain.gaps.discard(seq)
            self._reordered(chain, seq)
        else:
            self._break(
                chain,
                seq,
                DUPLICATED,
                f"event #{seq} appears again after #{chain.expected_sequence - 1} (a copy of "
                f"it, or a second event with the same sequence number)",
            )

    def _gap(self, chain: ChainResult, event: HistoryEvent) -> None:
        first, last = chain.expected_sequence, event.sequence - 1
        if len(chain.gaps) < _MAX_GAP:
            chain.gaps.update(range(first, min(last + 1, first + _MAX_GAP)))
        if chain.broken is None:
            chain.first_gap = (first, last)
        span = f"#{first}" if first == last else f"#{first}..#{last}"
        hint = ""
        if first == 0 and not self.partial:
            hint = " (for an export of a time range, verify with --partial)"
        self._break(
            chain,
            first,
            MISSING,
            f"event {span} missing: the next event present is #{event.sequence}{hint}",
        )
        self._advance(chain, event)

    def _reordered(self, chain: ChainResult, seq: int) -> None:
        broken = chain.broken
        first, last = chain.first_gap
        if broken is not None and broken.kind == MISSING and first <= seq <= last:
            chain.broken = None  # the "missing" event turned up: it was moved, not removed
        self._break(
            chain,
            seq,
            REORDERED,
            f"event #{seq} comes after #{chain.expected_sequence - 1}: events are out of order",
        )

    def _advance(self, chain: ChainResult, event: HistoryEvent) -> None:
        if event.sequence == 0:
            chain.start_hashes.add(event.hash)
        chain.expected_sequence = max(chain.expected_sequence, event.sequence + 1)
        chain.last_hash = event.hash

    def _break(self, chain: ChainResult, seq: int, kind: str, detail: str) -> None:
        if chain.broken is None:
            chain.broken = ChainBreak(chain.instance_id, seq, kind, detail, chain.events - 1)


def verify_records(
    records: Iterable[tuple[bytes | None, bytes]], *, partial: bool = False
) -> list[ChainResult]:
    """Verify ``(key, value)`` history records, in topic order, per instance."""
    verifier = ChainVerifier(partial=partial)
    for key, value in records:
        verifier.feed(value, None if key is None else key.decode("utf-8", "replace"))
    return verifier.results()


def verify_events(events: Iterable[HistoryEvent], *, partial: bool = False) -> list[ChainResult]:
    """Verify decoded events (from an exported file) by encoding them again.

    Exports hold the events, not the original bytes, so this checks the hashes against the
    current schema's encoding: exports of events written with an older schema version do
    not verify (verify those on the topic, where the original bytes are kept).
    """
    return verify_records(((None, encode_history(e)) for e in events), partial=partial)
