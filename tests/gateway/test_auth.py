"""Virtual-key authentication: a presented secret longer than any key Sentinel issues is refused as
it is, never hashed or looked up."""

from __future__ import annotations

import secrets

import httpx

from sentinel import redis_keys
from sentinel.redis_clients import sync_redis
from tenants.services import KEY_PREFIX, key_digest


def looked_up(secret: str) -> bool:
    """Whether the gateway looked this secret up: every lookup of an unknown key leaves a remembered
    miss in Redis, under the digest of the secret."""
    return bool(sync_redis().keys(redis_keys.key_info("*", key_digest(secret))))


def test_an_over_long_key_is_refused_without_a_lookup(gateway, model):
    chat = {"model": model[0], "messages": [{"role": "user", "content": "hi"}]}
    wrong = KEY_PREFIX + secrets.token_urlsafe(32)  # as long as a real key
    long_ones = [KEY_PREFIX + "a" * 129, KEY_PREFIX + secrets.token_urlsafe(7_000)]
    sent = [
        {"authorization": f"Bearer {wrong}"},
        *({"authorization": f"Bearer {secret}"} for secret in long_ones),
        *({"x-api-key": secret} for secret in long_ones),
    ]
    for headers in sent:
        refused = httpx.post(f"{gateway.base_url}/chat/completions", headers=headers, json=chat, timeout=30)
        assert refused.status_code == 401
        assert refused.json()["error"] == {
            "message": "Invalid API key. Check the key you passed in the Authorization header.",
            "type": "authentication_error",
            "param": None,
            "code": "invalid_api_key",
        }
    assert looked_up(wrong)  # the probe works: a key of the right size was looked up
    assert not any(looked_up(secret) for secret in long_ones)
