"""The payload codec chain: bytes-to-bytes steps (compression, encryption, a user's own)
applied to every payload after its converter made bytes of it, and undone before decoding.

Why a chain recorded in the payload: processes are configured one by one and settings
change over time, so a reader cannot rely on its own settings to know what a stored payload
went through. The names of the codecs applied are appended to the payload's encoding
(``json;codecs=zstd,aes-gcm``), so any reader undoes exactly what the writer did - a
payload written before the setting changed stays readable, and one history may hold both.
A reader in another language sees an encoding it does not know and keeps the bytes as they
are.

Pure: the codecs that need third-party libraries (``zstd``, ``aes-gcm``) live in
``engine.codec.payload_codecs`` and are registered here by name when a process applies its
settings (``engine.config.payloads.install_payload_codecs``). A user's codec is any object
with a ``name`` and ``encode``/``decode`` methods, registered with :func:`register_codec`.
"""

from __future__ import annotations

from typing import Protocol

from engine.core.errors import CodecError

#: What separates a payload's converter encoding from the names of the codecs applied.
CHAIN_MARK = ";codecs="


class PayloadCodec(Protocol):
    """One step of the chain: ``decode(encode(data)) == data`` for all bytes."""

    name: str

    def encode(self, data: bytes) -> bytes: ...

    def decode(self, data: bytes) -> bytes: ...


class PayloadCodecError(CodecError):
    """A payload's codec chain cannot be applied or undone (unknown codec, missing key,
    altered bytes)."""


_REGISTERED: dict[str, PayloadCodec] = {}
#: The chain new payloads go through (names, applied first to last); empty: none. Read it
#: (the runtime's fast path checks it per value); set it with :func:`use_codecs`.
ACTIVE_CHAIN: list[tuple[str, ...]] = [()]


def register_codec(codec: PayloadCodec) -> None:
    """Add or replace the codec named ``codec.name`` (in this process; every process that
    writes or reads payloads with it must register it, as for converters)."""
    name = getattr(codec, "name", None)
    if not isinstance(name, str) or not _valid_name(name):
        raise PayloadCodecError(
            f"a payload codec needs a name of letters, digits, '-', '_' or '.', got {name!r}"
        )
    _REGISTERED[name] = codec


def registered_codecs() -> tuple[str, ...]:
    """The names of the codecs this process can apply and undo."""
    return tuple(sorted(_REGISTERED))


def use_codecs(names: tuple[str, ...] | list[str]) -> None:
    """Make ``names`` (applied first to last) the chain for new payloads of this process.

    A name need not be registered yet (a user's codec is often registered by a module the
    process imports later); the first payload that needs it fails with the reason instead.
    """
    for name in names:
        if not _valid_name(name):
            raise PayloadCodecError(f"payload codec name {name!r} is not valid")
    if len(set(names)) != len(names):
        raise PayloadCodecError(f"payload codecs {list(names)} name one codec twice")
    ACTIVE_CHAIN[0] = tuple(names)


def active_codecs() -> tuple[str, ...]:
    """The chain new payloads go through in this process."""
    return ACTIVE_CHAIN[0]


def seal_bytes(data: bytes, encoding: str) -> tuple[bytes, str]:
    """Apply the active chain to converter output ``data`` of ``encoding``; returns the
    stored bytes and the encoding that records the chain. Already sealed values and an
    empty chain pass through unchanged."""
    chain = ACTIVE_CHAIN[0]
    if not chain or CHAIN_MARK in encoding:
        return data, encoding
    for name in chain:
        data = _codec(name).encode(data)
    return data, f"{encoding}{CHAIN_MARK}{','.join(chain)}"


def unseal_bytes(data: bytes, encoding: str) -> tuple[bytes, str]:
    """Undo the chain that ``encoding`` records (last codec first); returns the converter's
    bytes and encoding. Values without a chain pass through unchanged."""
    inner, names = split_encoding(encoding)
    for name in reversed(names):
        data = _codec(name).decode(data)
    return data, inner


def split_encoding(encoding: str) -> tuple[str, tuple[str, ...]]:
    """A stored encoding as (converter encoding, codec names applied first to last)."""
    inner, mark, chain = encoding.partition(CHAIN_MARK)
    if not mark:
        return encoding, ()
    return inner, tuple(chain.split(","))


def _codec(name: str) -> PayloadCodec:
    try:
        return _REGISTERED[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTERED)) or "none"
        raise PayloadCodecError(
            f"no payload codec {name!r} in this process (registered: {known}). The built-in "
            f"ones (zstd, aes-gcm) come with the settings; register a codec of your own "
            f"with engine.core.payload_codecs.register_codec() in a module every process "
            f"imports"
        ) from None


def _valid_name(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "-_." for c in name)
