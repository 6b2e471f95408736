"""Secrets Sentinel must be able to read back (provider API keys, webhook signing secrets) are stored
encrypted with a key derived from SENTINEL_ENCRYPTION_KEY (Fernet: AES-128-CBC + HMAC-SHA256)."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def _fernet(purpose: str) -> Fernet:
    key = hashlib.sha256(f"{purpose}:{settings.ENCRYPTION_KEY}".encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def encrypt(purpose: str, secret: str) -> bytes:
    return _fernet(purpose).encrypt(secret.encode()) if secret else b""


def decrypt(purpose: str, token: bytes) -> str:
    try:
        return _fernet(purpose).decrypt(bytes(token)).decode()
    except InvalidToken:
        raise RuntimeError(
            f"a stored {purpose} secret cannot be decrypted (SENTINEL_ENCRYPTION_KEY changed?)"
        ) from None
