"""The Lua scripts Redis runs for admission, settling, breakers, deployment slots and batch pacing, and
their loader (scripts.py)."""
