"""A software WebAuthn authenticator for the view tests: a P-256 key pair that answers registration
and assertion options the way a security key does (attestation "none", user present and verified),
so the server's real verification (py_webauthn, through django-otp-webauthn) checks real signatures.
The browser tests use Chromium's own virtual authenticator instead (tests/console/test_browser.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

UP_UV = 0x01 | 0x04  # user present, user verified
ATTESTED = 0x40  # authenticator data carries a credential


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class SoftwareAuthenticator:
    def __init__(self) -> None:
        self.private_key = ec.generate_private_key(ec.SECP256R1())
        self.credential_id = os.urandom(32)
        self.sign_count = 0

    def _client_data(self, kind: str, options: dict, origin: str) -> bytes:
        return json.dumps({"type": kind, "challenge": options["challenge"], "origin": origin}).encode()

    def _cose_key(self) -> bytes:
        numbers = self.private_key.public_key().public_numbers()
        return cbor2.dumps({1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"), -3: numbers.y.to_bytes(32, "big")})

    def register(self, options: dict, origin: str) -> dict:
        """The answer to navigator.credentials.create() with these options."""
        rp_hash = hashlib.sha256(options["rp"]["id"].encode()).digest()
        auth_data = (
            rp_hash
            + bytes([UP_UV | ATTESTED])
            + struct.pack(">I", self.sign_count)
            + bytes(16)  # AAGUID
            + struct.pack(">H", len(self.credential_id))
            + self.credential_id
            + self._cose_key()
        )
        attestation = cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})
        return {
            "id": b64url(self.credential_id),
            "rawId": b64url(self.credential_id),
            "type": "public-key",
            "response": {
                "clientDataJSON": b64url(self._client_data("webauthn.create", options, origin)),
                "attestationObject": b64url(attestation),
                "transports": ["usb"],
            },
            "clientExtensionResults": {"credProps": {"rk": False}},
        }

    def sign_assertion(self, options: dict, origin: str, rp_id: str, credential_id: bytes | None = None) -> dict:
        """The answer to navigator.credentials.get(): signed by this authenticator's key, naming its
        own credential or, to try one that is not its own, `credential_id`."""
        self.sign_count += 1
        auth_data = hashlib.sha256(rp_id.encode()).digest() + bytes([UP_UV]) + struct.pack(">I", self.sign_count)
        client_data = self._client_data("webauthn.get", options, origin)
        signature = self.private_key.sign(auth_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256()))
        raw_id = credential_id or self.credential_id
        return {
            "id": b64url(raw_id),
            "rawId": b64url(raw_id),
            "type": "public-key",
            "response": {
                "clientDataJSON": b64url(client_data),
                "authenticatorData": b64url(auth_data),
                "signature": b64url(signature),
            },
            "clientExtensionResults": {},
        }
