"""Prompt token bounds for admission: for a request and the deployments that may serve it, a number of
prompt tokens none of them will bill more than (docs/budgets.md), cheap enough for the request path.

A reservation is a worst case, so every figure here errs high, never low:

- Text is counted with the deployment's own tokenizer where it is public: OpenAI's encodings
  (o200k_base, cl100k_base) through tiktoken, loaded from the files litellm ships (never downloaded).
  Everything else (Anthropic, Gemini, Llama behind Ollama or vLLM, unknown names) gets the byte bound:
  every tokenizer these providers use emits at most one token per UTF-8 byte of text (byte-level
  BPE, or SentencePiece with byte fallback), so tokens <= bytes, plus a prefix token per string.
- Each message, name and tool adds framing tokens, generously above what OpenAI documents (3 per
  message, 1 per name, 3 to prime the reply); tool, function and response-format schemas are counted
  as their JSON plus one token per scalar in it for the way providers re-render them (OpenAI as a
  TypeScript namespace, Anthropic inside a tool-use system prompt of at most a few hundred tokens).
- Images follow litellm's per-model rules (OpenAI tiles or patches, Anthropic's per-image budget) at
  the largest size when the image's own is unknown; models litellm has no rule for get the largest
  figure litellm knows for any model (gpt-4o-mini, high detail: 48,169 tokens).
- What only the model's context window bounds (files, audio, content of an unknown type) reserves
  that window; no provider bills a prompt longer than it. Every bound is capped by it too.

The exact count costs time (about 0.4 µs a character of CJK text, 0.04 of English), so it is spent
only where it decides something: admission asks for it when a hard budget or a tokens-per-minute
limit applies, counts at most EXACT_BYTES of text exactly (the rest by bytes: at most about 4 ms of
CJK, 1.3 ms of English), on the event loop, and remembers the counts of long strings that come back
(system prompts, tool schemas). Until 2026-12-06 text past 4 KB was counted on a worker thread: on a
busy event loop the hop alone cost 0.3 to 1.5 s (9 KB of English, 0.2 ms inline), the thread waiting
for the interpreter each time the tokenizer handed it back. Written here because litellm's
token_counter fits none of this: it fetches image URLs to size them, downloads Hugging Face
tokenizers for some models, and counts Claude 3+ prompts with Claude 2's tokenizer, which
undercounts them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import orjson

log = logging.getLogger(__name__)

EXACT_BYTES = 32 * 1024  # text counted with the tokenizer per request; past it, one token per byte
REMEMBERED_BYTES = (1024, 16 * 1024)  # strings this long are remembered with their counts ...
REMEMBERED = 256  # ... this many, most recent first: system prompts and tool schemas come back
MESSAGE_FRAMING = 4  # per message, besides its role's and name's own tokens (OpenAI: 3, name +1)
REPLY_PRIMING = 4  # per request (OpenAI: 3)
TOOL_FRAMING = 16  # per tool or function, besides its JSON
TOOLS_PREAMBLE = 32  # once when tools are given (OpenAI's namespace header and footer)
TOOL_PROMPT_TOKENS = 600  # non-OpenAI families: Anthropic's tool-use system prompt (346-530 documented)
UNKNOWN_IMAGE_TOKENS = 48_169  # the largest per-image figure litellm knows (gpt-4o-mini, 8 high-detail tiles)
UNKNOWN_CONTEXT_TOKENS = 2_000_000  # a model whose context window litellm does not know
TIKTOKEN_FAMILIES = ("openai", "azure", "text-completion-openai")
ENCODINGS = ("o200k_base", "cl100k_base")

# --- tokenizers --------------------------------------------------------------------------------


def _bundled_encodings() -> Path | None:
    """litellm's copy of tiktoken's encoding files (found without importing litellm)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"


_load_lock = threading.Lock()


@cache
def encoding(name: str):
    """A tiktoken encoding from litellm's bundled files, or None when they are missing: tiktoken would
    download it, which this never lets happen (the byte bound serves instead)."""
    import tiktoken

    folder = _bundled_encodings()
    blob = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
    if folder is None or not (folder / hashlib.sha1(blob.encode(), usedforsecurity=False).hexdigest()).exists():
        log.warning("tiktoken encoding %s is not bundled with litellm; prompts are bounded by bytes", name)
        return None
    with _load_lock:
        # The folder litellm points tiktoken at too (its import sets the same variable).
        os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
        return tiktoken.get_encoding(name)


def warm_up() -> None:
    """Load OpenAI's encodings now (about a second for o200k_base) rather than on a first request."""
    for name in ENCODINGS:
        encoding(name)


@dataclass(frozen=True)
class Counting:
    """How one deployment's prompts are bounded."""

    litellm_model: str
    encoding_name: str | None  # a tiktoken encoding; None: the byte bound
    context: int | None  # its context window (max input tokens), when litellm knows it
    image_family: bool  # litellm has an image token rule for it

    @property
    def openai(self) -> bool:
        return self.encoding_name is not None


def _split(litellm_model: str) -> tuple[str, str]:
    provider, slash, name = litellm_model.partition("/")
    return (provider, name) if slash else ("", litellm_model)


@lru_cache(maxsize=1024)
def counting_for(litellm_model: str) -> Counting:
    import litellm
    import tiktoken
    from litellm.litellm_core_utils.token_counter import _image_model_family

    provider, name = _split(litellm_model)
    encoding_name = None
    if provider in ("", *TIKTOKEN_FAMILIES):
        try:
            found = tiktoken.encoding_name_for_model(name)
        except KeyError:
            found = None
        encoding_name = found if found in ENCODINGS else None
    context = None
    for candidate in (litellm_model, name):
        info = litellm.model_cost.get(candidate)
        if info and isinstance(info.get("max_input_tokens"), int) and info["max_input_tokens"] > 0:
            context = info["max_input_tokens"]
            break
    return Counting(litellm_model, encoding_name, context, _image_model_family(litellm_model) is not None)


# --- what a request's prompt is made of --------------------------------------------------------


@dataclass
class Prompt:
    """The parts of a request a provider bills as prompt tokens, gathered once per request."""

    texts: list[str]  # billed as text
    schemas: list[str]  # JSON billed as re-rendered text (tools, functions, response format, tool calls)
    schema_values: int  # JSON values in them: one token of slack each
    messages: int
    names: int
    tools: int
    images: list[tuple[str, str]]  # (url, detail)
    open_ended: bool  # something only the context window bounds

    def text_bytes(self) -> int:
        return sum(_byte_length(s) for s in self.texts) + sum(_byte_length(s) for s in self.schemas)


def _byte_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _values(node) -> int:
    """Scalar values in a structure: the slack a re-rendering of it may need (OpenAI's namespace joins
    enum values with " | " where JSON has one "," token; everything else it renders shorter)."""
    if isinstance(node, dict):
        return sum(_values(v) for v in node.values())
    if isinstance(node, list):
        return sum(_values(v) for v in node)
    return 1


def _json(value) -> str:
    return orjson.dumps(value).decode()


def gather(body: dict) -> Prompt:
    prompt = Prompt([], [], 0, 0, 0, 0, [], False)
    for message in body.get("messages") or ():
        prompt.messages += 1
        if not isinstance(message, dict):
            prompt.schemas.append(_json(message))
            continue
        for key, value in message.items():
            if value is None:
                continue
            if key == "content":
                _gather_content(prompt, value)
            elif key == "name":
                prompt.names += 1
                prompt.texts.append(str(value))
            elif key in ("role", "tool_call_id") and isinstance(value, str):
                prompt.texts.append(value)
            elif key == "audio":
                prompt.open_ended = True  # an earlier spoken answer, billed at its length
            else:  # tool_calls, function_call, or whatever else a provider may render
                _gather_schema(prompt, value)
    for key in ("tools", "functions"):
        tools = body.get(key)
        if tools:
            prompt.tools += len(tools) if isinstance(tools, list) else 1
            _gather_schema(prompt, tools)
    for key in ("tool_choice", "response_format"):
        if isinstance(body.get(key), dict):
            _gather_schema(prompt, body[key])
    return prompt


def _gather_content(prompt: Prompt, content) -> None:
    if isinstance(content, str):
        prompt.texts.append(content)
        return
    if not isinstance(content, list):
        _gather_schema(prompt, content)
        return
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "refusal") and isinstance(part.get(kind), str):
            prompt.texts.append(part[kind])
        elif kind == "image_url" and isinstance(part.get("image_url"), dict):
            image = part["image_url"]
            prompt.images.append((str(image.get("url") or ""), str(image.get("detail") or "auto")))
        else:  # files, audio, kinds this gateway does not know
            prompt.open_ended = True


def _gather_schema(prompt: Prompt, value) -> None:
    try:
        text = _json(value)
    except orjson.JSONEncodeError:  # nested past what any provider accepts: bounded by the window alone
        prompt.open_ended = True
        return
    prompt.schemas.append(text)
    prompt.schema_values += _values(value)


# --- the bound ---------------------------------------------------------------------------------


class _Budget:
    def __init__(self, exact: bool) -> None:
        self.left = EXACT_BYTES if exact else 0


_remembered: OrderedDict[tuple[str, str], int] = OrderedDict()
_remembered_lock = threading.Lock()  # counting also runs on the worker threads


def _count(text: str, tokenizer, budget: _Budget) -> int:
    size = _byte_length(text)
    if tokenizer is None or not budget.left:
        return size + 1  # one token per byte, and a word-boundary prefix some tokenizers add
    remember = REMEMBERED_BYTES[0] <= size <= REMEMBERED_BYTES[1]
    if remember:
        with _remembered_lock:
            found = _remembered.get((tokenizer.name, text))
            if found is not None:
                _remembered.move_to_end((tokenizer.name, text))
                return found
    if size > budget.left:
        return size + 1
    budget.left -= size
    count = len(tokenizer.encode_ordinary(text))
    if remember:
        with _remembered_lock:
            _remembered[(tokenizer.name, text)] = count
            while len(_remembered) > REMEMBERED:
                _remembered.popitem(last=False)
    return count


def _image_tokens(counting: Counting, url: str, detail: str) -> int:
    if not counting.image_family or detail not in ("low", "high", "auto"):
        return UNKNOWN_IMAGE_TOKENS
    from litellm.litellm_core_utils.token_counter import estimate_image_tokens

    # Reads an inline image's size from its header; a URL is never fetched (the largest size counts).
    return estimate_image_tokens(counting.litellm_model, url, detail)


def bound_for(prompt: Prompt, counting: Counting, *, exact: bool) -> int:
    """The most prompt tokens `counting`'s deployment can bill for `prompt`."""
    context = counting.context or UNKNOWN_CONTEXT_TOKENS
    if prompt.open_ended:
        return context
    tokenizer = encoding(counting.encoding_name) if counting.encoding_name else None
    budget = _Budget(exact and tokenizer is not None)
    total = REPLY_PRIMING + MESSAGE_FRAMING * prompt.messages + prompt.names
    total += sum(_count(text, tokenizer, budget) for text in prompt.texts)
    total += sum(_count(schema, tokenizer, budget) for schema in prompt.schemas) + prompt.schema_values
    if prompt.tools:
        total += TOOLS_PREAMBLE + TOOL_FRAMING * prompt.tools + (0 if counting.openai else TOOL_PROMPT_TOKENS)
    total += sum(_image_tokens(counting, url, detail) for url, detail in prompt.images)
    return min(total, context)


def prompt_bound(body: dict, litellm_models: Iterable[str], *, exact: bool = True) -> int:
    """The most prompt tokens any of these deployments can bill for this request body. With
    exact=False, text is bounded by its bytes alone (for requests no budget or token limit applies to)."""
    prompt = gather(body)
    countings = {counting_for(model) for model in litellm_models}
    return max((bound_for(prompt, counting, exact=exact) for counting in countings), default=0)


async def aprompt_bound(body: dict, litellm_models: Iterable[str], *, exact: bool = True) -> int:
    """prompt_bound for the request path (see the module: counted on the event loop)."""
    return prompt_bound(body, litellm_models, exact=exact)


# The encoding that stands in for a model whose tokenizer is not public (Anthropic's, Gemini's): the
# one litellm's own token counter falls back to.
FALLBACK_ENCODING = "cl100k_base"


def completion_count(litellm_model: str, text: str) -> int:
    """Tokens of answer text a deployment produced, by its tokenizer (FALLBACK_ENCODING where it is
    not public): what a stream the client left before the provider's usage arrived is billed for."""
    if not text:
        return 0
    counting = counting_for(litellm_model)
    return len(encoding(counting.encoding_name or FALLBACK_ENCODING).encode_ordinary(text))


def prediction_bound(body: dict, litellm_models: Iterable[str], *, exact: bool = True) -> int:
    """Tokens of a Predicted Outputs `prediction`: those the answer does not use are billed as
    completion tokens besides the answer's own (0 without one)."""
    prediction = body.get("prediction")
    if not isinstance(prediction, dict) or prediction.get("content") is None:
        return 0
    return prompt_bound({"messages": [{"content": prediction["content"]}]}, litellm_models, exact=exact)
