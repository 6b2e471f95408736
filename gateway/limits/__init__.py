"""Limits: admission (every rate limit, budget, spend cap and concurrency slot of a request, taken in one
atomic Redis step and settled after the call) and the prompt token bounds its reservations are made of."""
