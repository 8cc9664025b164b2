"""The built-in payload codecs: ``zstd`` (compression) and ``aes-gcm`` (encryption).

They sit in the codec layer because they need libraries (``zstandard``, ``cryptography``)
that the pure core may not import; both libraries are imported on first use, so a process
that never meets such a payload does not need them, and one that does is told which extra
to install.

An ``aes-gcm`` payload carries the id of the key it was encrypted with, so a process holding
several keys (a rotation: the newest encrypts, the older ones still decrypt) knows which to
use, and a process without that key names it in the error.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from engine.core.payload_codecs import PayloadCodecError

ZSTD = "zstd"
AES_GCM = "aes-gcm"

#: First byte of an ``aes-gcm`` payload: the layout version (version, key id, nonce, data).
_AES_FORMAT = 1
_NONCE_SIZE = 12
_KEY_SIZES = (16, 24, 32)
#: Authenticated with every payload, so bytes encrypted for something else do not decrypt.
_AAD = b"turnstile-payload"


def _zstd() -> ModuleType:
    try:
        import zstandard
    except ImportError:
        raise _missing("zstandard", "zstd", ZSTD) from None
    return zstandard


def _aead() -> ModuleType:
    try:
        from cryptography.hazmat.primitives.ciphers import aead
    except ImportError:
        raise _missing("cryptography", "encryption", AES_GCM) from None
    return aead


def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag

    return InvalidTag


def _missing(module: str, extra: str, codec: str) -> PayloadCodecError:
    return PayloadCodecError(
        f"the {codec!r} payload codec needs the {module} library: "
        f"pip install 'turnstile-engine[{extra}]'"
    )


class ZstdCodec:
    """Zstandard compression; level 3 is zstd's default, fast with a good ratio for JSON."""

    name = ZSTD

    def __init__(self, level: int = 3) -> None:
        self.level = level
        #: zstd contexts are not thread-safe, and workers run activities in threads: one
        #: compressor and decompressor per thread, made on its first payload.
        self._local = threading.local()

    def encode(self, data: bytes) -> bytes:
        compressor = getattr(self._local, "compressor", None)
        if compressor is None:
            compressor = self._local.compressor = _zstd().ZstdCompressor(level=self.level)
        return bytes(compressor.compress(data))

    def decode(self, data: bytes) -> bytes:
        zstd = _zstd()
        decompressor = getattr(self._local, "decompressor", None)
        if decompressor is None:
            decompressor = self._local.decompressor = zstd.ZstdDecompressor()
        try:
            # the frame records the size (compress() writes it), so no limit is guessed here
            return bytes(decompressor.decompress(data))
        except zstd.ZstdError as exc:
            raise PayloadCodecError(f"payload is not valid zstd data: {exc}") from exc


class AesGcmCodec:
    """AES-GCM with keys by id: the last key of ``keys`` encrypts, every key decrypts.

    ``keys`` maps key ids to 16, 24 or 32 raw bytes (AES-128, -192, -256), oldest first.
    """

    name = AES_GCM

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        for key_id, key in keys.items():
            if not key_id or len(key_id.encode()) > 255:
                raise PayloadCodecError(f"payload key id {key_id!r} must be 1 to 255 bytes")
            if len(key) not in _KEY_SIZES:
                raise PayloadCodecError(
                    f"payload key {key_id!r} is {len(key)} bytes; AES-GCM takes 16, 24 or "
                    f"32 (make one with: python -c 'import os,base64;"
                    f"print(base64.b64encode(os.urandom(32)).decode())')"
                )
        self.keys = dict(keys)
        self._ciphers: dict[str, Any] = {}

    @property
    def encrypting_key(self) -> str | None:
        """The id of the key new payloads are encrypted with (the newest)."""
        return next(reversed(self.keys), None)

    def encode(self, data: bytes) -> bytes:
        key_id = self.encrypting_key
        if key_id is None:
            raise PayloadCodecError(
                "the aes-gcm payload codec has no key: set payload_key_file or "
                "TURNSTILE_PAYLOAD_KEYS (see docs/how-to/payloads.md)"
            )
        nonce = os.urandom(_NONCE_SIZE)
        sealed = self._cipher(key_id).encrypt(nonce, data, _AAD)
        ident = key_id.encode()
        return bytes((_AES_FORMAT, len(ident))) + ident + nonce + bytes(sealed)

    def decode(self, data: bytes) -> bytes:
        if len(data) < 2 or data[0] != _AES_FORMAT:
            raise PayloadCodecError("payload is not aes-gcm data of a known layout")
        end = 2 + data[1]
        key_id = data[2:end].decode(errors="replace")
        if key_id not in self.keys:
            known = ", ".join(self.keys) or "none"
            raise PayloadCodecError(
                f"payload was encrypted with key id {key_id!r}, which this process does not "
                f"have (its keys: {known}); add that key to payload_key_file or "
                f"TURNSTILE_PAYLOAD_KEYS - keep old keys after a rotation"
            )
        nonce, sealed = data[end : end + _NONCE_SIZE], data[end + _NONCE_SIZE :]
        cipher = self._cipher(key_id)
        try:
            return bytes(cipher.decrypt(nonce, sealed, _AAD))
        except _invalid_tag():
            raise PayloadCodecError(
                f"payload encrypted with key id {key_id!r} does not decrypt: its bytes were "
                f"altered, or the key under that id is not the one it was written with"
            ) from None

    def _cipher(self, key_id: str) -> Any:
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            aead = _aead()
            cipher = self._ciphers[key_id] = aead.AESGCM(self.keys[key_id])
        return cipher
