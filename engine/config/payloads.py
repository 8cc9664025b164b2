"""Applying the ``payload_*`` settings: the codec chain and the AES-GCM keys of a process.

Every process that writes or reads payloads - processor, worker, client, audit tools,
dashboard, the test engine - calls :func:`install_payload_codecs` with its settings, so one
config file sets the chain everywhere instead of code that has to be repeated by hand in
each of them. The built-in codecs are registered whatever the chain says, so a process
with no chain (or another one) still reads payloads written with them.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from engine.codec.payload_codecs import AES_GCM, ZSTD, AesGcmCodec, ZstdCodec
from engine.config.settings import Settings
from engine.core.errors import ConfigurationError
from engine.core.payload_codecs import PayloadCodecError, register_codec, use_codecs


def install_payload_codecs(settings: Settings) -> None:
    """Register the built-in codecs (with this process's keys) and make the setting's chain
    the one new payloads go through. Process-wide, like converters."""
    try:
        builtin: dict[str, ZstdCodec | AesGcmCodec] = {
            ZSTD: ZstdCodec(),
            AES_GCM: AesGcmCodec(payload_keys(settings)),
        }
        for codec in builtin.values():
            register_codec(codec)
        use_codecs(settings.payload_codecs)
        for name in settings.payload_codecs:
            if name in builtin:  # a missing library or key stops the process here, not
                _round_trip(builtin[name])  # in the middle of its first turn
    except PayloadCodecError as exc:
        raise ConfigurationError(f"payload codecs: {exc}") from exc


def _round_trip(codec: ZstdCodec | AesGcmCodec) -> None:
    probe = b"turnstile payload codec check"
    if codec.decode(codec.encode(probe)) != probe:
        raise PayloadCodecError(f"the {codec.name} payload codec does not give back its input")


def payload_keys(settings: Settings) -> dict[str, bytes]:
    """The AES-GCM keys by id, oldest first: the key file's, then ``payload_keys``'s (the
    last one encrypts new payloads)."""
    keys: dict[str, bytes] = {}
    if settings.payload_key_file:
        path = Path(settings.payload_key_file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigurationError(
                f"payload_key_file {path} cannot be read ({exc.strerror}); check the path "
                f"([payloads] key_file or TURNSTILE_PAYLOAD_KEY_FILE)"
            ) from None
        _parse_keys(text.splitlines(), f"payload_key_file {path}", keys)
    if settings.payload_keys:
        _parse_keys(settings.payload_keys.split(","), "TURNSTILE_PAYLOAD_KEYS", keys)
    return keys


def _parse_keys(entries: list[str], where: str, keys: dict[str, bytes]) -> None:
    for number, raw in enumerate(entries, 1):
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        key_id, colon, encoded = entry.partition(":")
        if not colon or not key_id.strip():
            raise ConfigurationError(
                f"{where}: entry {number} is not KEY_ID:BASE64 (for example "
                f"2026-12:q83v...=); never put the key itself in an error report"
            )
        try:
            key = base64.b64decode(encoded.strip(), validate=True)
        except binascii.Error:
            raise ConfigurationError(
                f"{where}: the key of {key_id.strip()!r} is not valid base64"
            ) from None
        keys.pop(key_id.strip(), None)  # a repeated id moves to the end: it is the newest
        keys[key_id.strip()] = key
