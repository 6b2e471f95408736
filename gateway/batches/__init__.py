"""OpenAI's Batch API: uploaded JSONL files of chat requests, run by Celery workers through the same
request path as interactive calls (cache, admission, budgets, routing, ledger), paced per tenant,
with leased items so that a worker's death loses nothing and runs nothing twice to completion."""
