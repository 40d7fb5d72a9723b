"""Ed25519 signatures over a canonical JSON form (the envelope python-tuf uses).

A signed document is ``{"signed": {...}, "signatures": [{"keyid", "sig"}]}``.
The bytes signed are the canonical JSON of ``signed``: keys sorted, no
insignificant whitespace, UTF-8, no NaN. ``keyid`` is the SHA-256 of the raw
32-byte public key, hex. ``verify_signed`` accepts a document only when at
least ``threshold`` distinct trusted keys signed exactly these canonical
bytes (two signatures by one key count once); an unknown key's signature
neither counts nor fails the document (keys rotate). Which keys are trusted
for which document, and how many must sign, is the root's to say (``_root``).
``cryptography`` is imported on first use.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import ManifestError, SignatureError

__all__ = [
    "PublicKey",
    "SigningKey",
    "canonical_json",
    "sign_document",
    "verify_signed",
]


def canonical_json(value: Any) -> bytes:
    """The one byte string a JSON value is signed as."""
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise ManifestError(f"not canonical JSON: {e}") from e


@dataclass(frozen=True)
class PublicKey:
    """An Ed25519 public key (raw 32 bytes) and its key id."""

    raw: bytes

    def __post_init__(self) -> None:
        if len(self.raw) != 32:
            raise ManifestError(f"an Ed25519 public key is 32 bytes, got {len(self.raw)}")

    @property
    def keyid(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()

    def to_text(self) -> str:
        """``ed25519:<base64>``: one line, fit for a config file or an env variable."""
        return "ed25519:" + base64.b64encode(self.raw).decode()

    @classmethod
    def from_text(cls, text: str) -> PublicKey:
        text = text.strip()
        if not text.startswith("ed25519:"):
            raise ManifestError("a public key reads 'ed25519:<base64 of 32 bytes>'")
        try:
            return cls(base64.b64decode(text[len("ed25519:") :], validate=True))
        except binascii.Error as e:
            raise ManifestError(f"public key is not valid base64: {e}") from e

    @classmethod
    def load(cls, path: str | Path) -> PublicKey:
        return cls.from_text(Path(path).read_text())

    def verify(self, signature: bytes, data: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, data)
        except InvalidSignature:
            return False
        return True


class SigningKey:
    """An Ed25519 private key. Keep it off devices: they only need ``public_key``."""

    def __init__(self, private_raw: bytes) -> None:
        if len(private_raw) != 32:
            raise ManifestError(f"an Ed25519 private key is 32 bytes, got {len(private_raw)}")
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self._key = Ed25519PrivateKey.from_private_bytes(private_raw)
        self._raw = private_raw

    @classmethod
    def generate(cls) -> SigningKey:
        import os

        return cls(os.urandom(32))

    @property
    def public_key(self) -> PublicKey:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        return PublicKey(self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def to_text(self) -> str:
        return "ed25519-private:" + base64.b64encode(self._raw).decode()

    @classmethod
    def from_text(cls, text: str) -> SigningKey:
        text = text.strip()
        if not text.startswith("ed25519-private:"):
            raise ManifestError("a private key reads 'ed25519-private:<base64 of 32 bytes>'")
        try:
            return cls(base64.b64decode(text[len("ed25519-private:") :], validate=True))
        except binascii.Error as e:
            raise ManifestError(f"private key is not valid base64: {e}") from e

    @classmethod
    def load(cls, path: str | Path) -> SigningKey:
        return cls.from_text(Path(path).read_text())


def sign_document(signed: Mapping[str, Any], *keys: SigningKey) -> dict[str, Any]:
    """Wrap ``signed`` with one signature per key."""
    if not keys:
        raise ManifestError("sign_document needs at least one key")
    data = canonical_json(dict(signed))
    return {
        "signed": dict(signed),
        "signatures": [
            {"keyid": k.public_key.keyid, "sig": base64.b64encode(k.sign(data)).decode()}
            for k in keys
        ],
    }


def verify_signed(
    document: object, trusted: Mapping[str, PublicKey] | list[PublicKey], *, threshold: int = 1
) -> dict[str, Any]:
    """The ``signed`` part of ``document`` when enough trusted keys signed it."""
    if isinstance(trusted, list):
        trusted = {k.keyid: k for k in trusted}
    if not isinstance(document, dict) or not isinstance(document.get("signed"), dict):
        raise ManifestError("a signed document is an object with a 'signed' object")
    signatures = document.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise SignatureError("the document is not signed")
    data = canonical_json(document["signed"])
    good: set[str] = set()
    for entry in signatures[:16]:  # bound the work a hostile document can ask for
        if not isinstance(entry, dict):
            continue
        keyid, sig = entry.get("keyid"), entry.get("sig")
        key = trusted.get(keyid) if isinstance(keyid, str) else None
        if key is None or not isinstance(sig, str):
            continue
        try:
            raw_sig = base64.b64decode(sig, validate=True)
        except binascii.Error:
            continue
        if key.verify(raw_sig, data):
            good.add(key.keyid)
    if threshold < 1:
        raise ManifestError(f"a threshold is at least 1, got {threshold}")
    if len(good) < threshold:
        if good:
            raise SignatureError(
                f"signed by {len(good)} trusted key(s); the threshold is {threshold}"
            )
        known = any(isinstance(e, dict) and e.get("keyid") in trusted for e in signatures)
        raise SignatureError(
            "signature does not match the document (tampered?)"
            if known
            else "signed by no trusted key"
        )
    return dict(document["signed"])
