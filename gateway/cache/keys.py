"""What a cached answer is filed under.

The partition is everything that must match exactly for an answer to be reusable: the tenant, the
namespace, the resolved model (the alias and the deployments behind it), every request parameter
that can change an answer, and the conversation before the prompt (system prompt included). The
exact digest adds the prompt itself. The semantic tier only ever searches inside one partition.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import orjson

from gateway.cache.acceptance import SEMANTIC_MAX_CHARS, normalize_prompt

# Body fields that cannot change the answer; every other field (temperature, max_tokens, tools,
# response_format, seed, stop, ...) is part of the key.
ANSWER_NEUTRAL = frozenset(
    {"model", "messages", "stream", "stream_options", "user", "metadata", "cache", "store", "service_tier"}
)


@dataclass(frozen=True)
class CacheKey:
    partition: str
    exact: str
    prompt: str  # the normalized last user message, for the semantic tier ("" when not text)
    # An answer in the conversation before the prompt: the partition is that conversation's, and
    # most are never asked again (the next turn is another partition).
    conversation: bool = False

    @property
    def semantic(self) -> bool:
        """Whether the semantic tier may serve and store this prompt: text, and no longer than it reads
        (acceptance.SEMANTIC_MAX_CHARS); other prompts are served by the exact tier only."""
        return 0 < len(self.prompt) <= SEMANTIC_MAX_CHARS


def _normalized_message(message: dict) -> dict:
    content = message.get("content")
    if isinstance(content, str):
        content = normalize_prompt(content)
    elif isinstance(content, list):
        content = [
            {**part, "text": normalize_prompt(part["text"])} if isinstance(part.get("text"), str) else part
            for part in content
        ]
    return {**message, "content": content}


def _digest(value) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def cache_key(*, tenant_id: int, namespace: str, model_identity: tuple, body: dict) -> CacheKey:
    messages = [_normalized_message(m) for m in body["messages"]]
    params = {k: v for k, v in body.items() if k not in ANSWER_NEUTRAL}
    *context, last = messages
    prompt = last["content"] if last.get("role") == "user" and isinstance(last.get("content"), str) else ""
    partition = _digest(
        {"tenant": tenant_id, "namespace": namespace, "model": model_identity, "params": params, "context": context}
    )
    exact = _digest({"partition": partition, "last": last})
    conversation = any(m.get("role") == "assistant" for m in context)
    return CacheKey(partition=partition, exact=exact, prompt=prompt, conversation=conversation)
