"""A turn's large payloads go to the payloads topic in the turn's own transaction.

A value the workflow code made - an activity's input, a child's input, an event it sends,
its output, a continue-as-new input - above ``payload_inline_max_bytes`` is cut into chunks
that the turn emits to the payloads topic on the instance's own partition (the topic is
co-partitioned), ahead of the history, state and message records of the turn; those then
carry the reference (``engine.core.payload_refs``). Everything is in one transaction, so the
chunks become visible exactly when the records that refer to them do, and a batch that is
aborted and redone writes them again.

The reference's offset is a lower bound the adapter gives (the partition's end before the
transaction): the chunks are at or after it, and a reader scans forward from there.
"""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import fields, is_dataclass, replace
from typing import Any, TypeVar, cast

from engine.core.history import RecordPublished
from engine.core.payload_refs import chunk_key, digest, make_ref, split_chunks
from engine.core.payloads import Payload, ref_payload
from engine.runtime.actions import PublishRecord, TurnResult
from engine.services.processor.batch import Batch

T = TypeVar("T")


class Aside:
    """The references a turn made, by the payload objects they stand for: the instance
    row takes its input and output from the workflow's execution, which holds the full
    values, and must hold the references too."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Payload, Payload]] = {}

    def note(self, original: Payload, ref: Payload) -> None:
        self._by_id[id(original)] = (original, ref)  # the original kept: its id stays its

    def swap(self, payload: Payload | None) -> Payload | None:
        """The reference made for ``payload`` in this turn, or ``payload`` itself."""
        if payload is None:
            return None
        known = self._by_id.get(id(payload))
        return known[1] if known is not None and known[0] is payload else payload


def put_aside_turn(b: Batch, owner: str, result: TurnResult) -> tuple[TurnResult, Aside]:
    """``result`` with every payload over the inline limit replaced by its reference, its
    chunks emitted first, and what was replaced. :class:`PayloadTooLargeError
    <engine.core.errors.PayloadTooLargeError>` for one over ``payload_max_bytes`` (the
    caller fails the instance with it)."""
    aside = Aside()
    end = b.env.payload_offsets
    limits = b.env.limits
    if end is None or not limits.payload_inline:
        return result, aside
    made: dict[tuple[int, str, str], Payload] = {}

    def swap(payload: Payload) -> Payload:
        if not limits.kept_aside(payload):
            return payload
        sha = digest(payload.data)
        key = (len(payload.data), sha, payload.encoding)
        if key not in made:
            made[key] = _emit_chunks(b, owner, payload, sha, end(b.partition))
        aside.note(payload, made[key])
        return made[key]

    events = [e if _leaves(e.body) else _swapped(e, swap) for e in result.new_events]
    actions = [a if _leaves(a) else _swapped(a, swap) for a in result.actions]
    if not made:
        return result, aside
    return replace(result, new_events=events, actions=actions), aside


def _leaves(value: object) -> bool:
    """A record published to the user's topics leaves the engine as its value, never a
    reference (its readers know nothing of the payloads topic)."""
    return isinstance(value, PublishRecord | RecordPublished)


def _emit_chunks(b: Batch, owner: str, payload: Payload, sha: str, offset: int) -> Payload:
    topic = b.env.topics.payloads
    chunks = split_chunks(payload.data)
    for i, chunk in enumerate(chunks):
        b.emit(topic, chunk_key(owner, sha, i), chunk, b.partition)
    ref = make_ref(owner, payload.data, payload.encoding, len(chunks), topic, b.partition, offset)
    return ref_payload(ref)


def _swapped(value: T, swap: Any, depth: int = 0) -> T:
    """``value`` (an event, its body, an action) with its payload fields passed through
    ``swap``; nested dataclasses one level down (an event's body). Every event and action
    of every turn passes here, nearly all without a payload to swap: the fields to look at
    are known per class (:func:`_init_fields`), not asked of ``dataclasses`` each time."""
    names = _init_fields(type(value))
    if not names or depth > 1:
        return value
    changes: dict[str, Any] = {}
    for name in names:
        current = getattr(value, name)
        if isinstance(current, Payload):
            new = swap(current)
        elif _init_fields(type(current)):
            new = _swapped(current, swap, depth + 1)
        else:
            continue
        if new is not current:
            changes[name] = new
    return cast(T, replace(cast(Any, value), **changes)) if changes else value


_INIT_FIELDS: dict[type, tuple[str, ...]] = {}

#: Field types that never hold a payload or a dataclass that could.
_PLAIN: tuple[type, ...] = (str, int, float, bytes, type(None), enum.Enum)


def _init_fields(cls: type) -> tuple[str, ...]:
    """The fields ``replace`` can set on instances of ``cls`` that may hold a payload (none:
    not a dataclass; a class object itself is a ``type``, never a dataclass instance).
    A field typed as plain values only (``str``, ``int``, an enum...) is left out: an event
    has seven fields and only its body can hold one. Remembered per class: there are as
    many entries as classes."""
    names = _INIT_FIELDS.get(cls)
    if names is None:
        names = tuple(_may_hold(cls)) if is_dataclass(cls) else ()
        _INIT_FIELDS[cls] = names
    return names


def _may_hold(cls: type) -> list[str]:
    init = [f.name for f in fields(cls) if f.init]
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # a hint that does not resolve: look at every field, as before
        return init
    return [name for name in init if name not in hints or not _plain(hints[name])]


def _plain(hint: Any) -> bool:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return all(_plain(arg) for arg in typing.get_args(hint))
    return isinstance(hint, type) and issubclass(hint, _PLAIN)
