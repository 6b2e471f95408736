"""Moved to sentinel.localstate (the configuration-changed signal is the project's, not the gateway's).

Kept only for gateway/cache/, which is being rewritten on another branch and still imports this name;
delete it once nothing imports gateway.localstate."""

from sentinel.localstate import TTLCache, announce_change

__all__ = ["TTLCache", "announce_change"]
