"""Sealed records: secrets (OAuth tokens) kept in the store encrypted with AES-256-GCM.

The key is derived (HKDF-SHA256) from the `oauth_key` setting. Each record is bound to its place (the
associated data names its kind and key), so a sealed value copied under another key does not open. A record
carries a short id of the key that sealed it, so a gateway with another key says so instead of failing
obscurely.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

VERSION = 1
NONCE = 12


class SealError(Exception):
    """A sealed record cannot be opened; the message says why (never what it holds)."""


def _derive(secret: str, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=b"manifold sealed records", info=info).derive(
        secret.encode()
    )


class Sealer:
    """Seals and opens JSON objects with one key."""

    def __init__(self, secret: str) -> None:
        self._aead = AESGCM(_derive(secret, b"aes-256-gcm key v1", 32))
        self.key_id = _derive(secret, b"key id v1", 6).hex()

    def __repr__(self) -> str:
        return f"Sealer(key_id={self.key_id!r})"

    def seal(self, value: dict[str, Any], place: str) -> dict[str, Any]:
        """`value` encrypted, as a storable record bound to `place`."""
        nonce = os.urandom(NONCE)
        data = self._aead.encrypt(nonce, json.dumps(value).encode(), place.encode())
        return {"v": VERSION, "key": self.key_id, "sealed": base64.b64encode(nonce + data).decode()}

    def open(self, record: dict[str, Any], place: str) -> dict[str, Any]:
        """The value a record sealed at `place` holds; `SealError` when it cannot be opened."""
        if record.get("v") != VERSION or not isinstance(record.get("sealed"), str):
            raise SealError("not a sealed record")
        if record.get("key") != self.key_id:
            raise SealError("it was sealed with another oauth_key")
        try:
            raw = base64.b64decode(record["sealed"], validate=True)
            value = json.loads(self._aead.decrypt(raw[:NONCE], raw[NONCE:], place.encode()))
        except (ValueError, InvalidTag):
            raise SealError("it does not open with this oauth_key (altered, or moved from another place)") from None
        if not isinstance(value, dict):
            raise SealError("not a sealed record")
        return value
