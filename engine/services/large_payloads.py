"""Putting large payloads aside before the record that carries them is made.

The worker (an activity result) and the client (a start's input, an event's data) call
:class:`PayloadOffloader` with each payload they are about to put in a record: one above
``payload_inline_max_bytes`` is written to the payloads topic through the process's
:class:`PayloadWriter` (the Kafka adapter) and the reference comes back in its place; one
above ``payload_max_bytes`` raises :class:`~engine.core.errors.PayloadTooLargeError` before
anything is written. A writer in the adapters, this decision here: the services stay free
of Kafka.
"""

from __future__ import annotations

from typing import Protocol

from engine.core.limits import Limits
from engine.core.payloads import Payload


class PayloadWriter(Protocol):
    """Writes a payload's chunks for instance ``owner`` and gives its reference."""

    def put(self, owner: str, payload: Payload) -> Payload: ...


class PayloadOffloader:
    """Replaces payloads over the inline limit by references to their written chunks."""

    def __init__(self, limits: Limits, writer: PayloadWriter) -> None:
        self.limits = limits
        self.writer = writer

    def __call__(self, owner: str, payload: Payload | None) -> Payload | None:
        if not self.limits.kept_aside(payload):
            return payload
        assert payload is not None  # kept_aside is False for None
        return self.writer.put(str(owner), payload)
