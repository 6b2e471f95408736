"""What the mock provider answers, whatever format it speaks: the vocabulary its deterministic
answers are made of, the triggers a prompt can carry (refuse, call a tool, echo, harm), each virtual
provider's fault switches and counters, and prompt usage counted as OpenAI counts it (text, tools,
images). gateway.mock_provider (OpenAI's format) and gateway.mock_dialects (Anthropic's, Gemini's)
both build on it."""

from __future__ import annotations

import base64
import hashlib
import io
import math
import re
from dataclasses import asdict, dataclass, field, fields

import orjson

DEFAULT_PROVIDER = "default"

# Short common words: each one is a token of the answer, so an answer of N tokens is N words.
_VOCAB = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
    "amber",
    "basil",
    "cedar",
    "dune",
    "ember",
    "fern",
    "grove",
    "harbor",
    "iris",
    "jade",
    "koala",
    "lotus",
    "maple",
    "nectar",
    "olive",
    "pearl",
    "quartz",
    "river",
    "sage",
    "tulip",
]

# Moderation (/v1/moderations): flags a marker `[[harm:<category>]]` or a word from a small list.
MODERATION_CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)
HARM_MARKER = re.compile(r"\[\[harm:([a-z/-]+)\]\]")
HARM_WORDS = {"bloodbath": "violence/graphic", "massacre": "violence", "genocide": "hate/threatening"}

REFUSAL_TRIGGER = "[[refuse]]"
TOOL_TRIGGER = "[[tool]]"  # with `tools` in the request: the answer calls the first tool (arguments "{}")
ECHO_TRIGGER = "[[echo]]"  # the answer is the prompt's text after the marker, a word per token
REFUSAL_TEXT = "I'm sorry, but I can't help with that request."


@dataclass
class Faults:
    """Behaviour of one virtual provider. All times in milliseconds."""

    ttft_ms: float = 0.0  # time to the first token (stream) or before the body (non-stream)
    tpt_ms: float = 0.0  # time per further token
    tokens: int = 40  # answer length in tokens (words)
    error_rate: float = 0.0  # share of calls answered with `error_status` (deterministic spacing)
    error_status: int = 503
    error_code: str | None = None  # `error.code` in the error body (default: the status)
    error_message: str = "mock fault"
    retry_after: float | None = None  # seconds, sent with 429/503 errors when set
    stall_ms: float = 0.0  # extra wait before anything is sent (a hung provider)
    slow_ms: float = 0.0  # extra latency added to every answer (a slow but healthy provider)
    drop_after: int | None = None  # stream: close the connection after this many content tokens
    refuses: bool = True  # answer a prompt containing [[refuse]] with a refusal (False: a model that does not)
    # Prompt tokens reported as read from the provider's cache (OpenAI: prompt_tokens_details.cached_tokens,
    # within prompt_tokens; Anthropic: cache_read_input_tokens, besides input_tokens; Gemini:
    # cachedContentTokenCount, within promptTokenCount).
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0  # Anthropic: prompt tokens reported as written to its cache
    # OpenAI: reasoning tokens reported on top of the answer's (completion_tokens_details.reasoning_tokens,
    # within completion_tokens), as a reasoning model's hidden thinking.
    reasoning_tokens: int = 0
    # What its vLLM-style /metrics reports on top of the requests really in flight (a busy GPU server).
    load_running: int = 0  # vllm:num_requests_running
    load_waiting: int = 0  # vllm:num_requests_waiting
    load_kv_cache: float = 0.0  # vllm:kv_cache_usage_perc, a fraction (1 is 100 percent)
    # What its Ollama-style /api/ps reports: models loaded, and the share of their memory outside VRAM.
    load_models: int = 0
    load_offloaded: float = 0.0  # a fraction: 0 is all in VRAM
    # Prompt text (the last user message, exactly) → the answer given to it instead of the digest's:
    # two prompts that look alike can get different answers, or two phrasings one answer (the shadow
    # verification of semantic hits is tested with it).
    answers: dict[str, str] = field(default_factory=dict)

    def update(self, values: dict) -> None:
        known = {f.name: f.type for f in fields(self)}
        for name, value in values.items():
            if name not in known:
                raise ValueError(f"unknown fault setting: {name}")
            if name == "answers" and not (
                isinstance(value, dict) and all(isinstance(v, str) for v in (*value, *value.values()))
            ):
                raise ValueError("answers must map prompt text to answer text")
            setattr(self, name, value)


@dataclass
class ProviderState:
    faults: Faults = field(default_factory=Faults)
    calls: int = 0
    errors: int = 0
    completed: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    last_model: str | None = None
    last_key_digest: str | None = None
    last_request_id: str | None = None  # the x-request-id header a gateway sent
    last_body: str | None = None  # the last request body received (chat or moderation), as text
    # The last multipart form (image edits and variations): text fields as sent, files as
    # [filename, SHA-256, media type].
    last_form: dict | None = None
    moderation_calls: int = 0
    _error_accumulator: float = 0.0

    def note(self, auth: str, request_id: str | None, raw: bytes) -> None:
        """What the tests read back of the latest call (its key only as a digest)."""
        self.last_key_digest = hashlib.sha256(auth.encode()).hexdigest()[:16] if auth else None
        self.last_request_id = request_id
        self.last_body = raw.decode(errors="replace")

    def should_fail(self) -> bool:
        """Deterministic error spacing: rate 0.25 fails exactly every 4th call."""
        rate = self.faults.error_rate
        if rate <= 0:
            return False
        if rate >= 1:
            return True
        self._error_accumulator += rate
        if self._error_accumulator >= 1.0:
            self._error_accumulator -= 1.0
            return True
        return False

    def stats(self) -> dict:
        return {
            "calls": self.calls,
            "errors": self.errors,
            "completed": self.completed,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "last_model": self.last_model,
            "last_key_digest": self.last_key_digest,
            "last_request_id": self.last_request_id,
            "last_body": self.last_body,
            "last_form": self.last_form,
            "moderation_calls": self.moderation_calls,
            "faults": asdict(self.faults),
        }


def prompt_of(messages: list) -> str:
    """The text the answer is derived from: the last user message's text."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def answer_tokens(
    prompt: str, n_tokens: int, *, refuses: bool = True, answers: dict[str, str] | None = None
) -> list[str]:
    """The answer to `prompt` as a list of tokens: the one `answers` sets for it, a word per token,
    else derived from the prompt's digest (its first token names the digest)."""
    digest = hashlib.sha256(prompt.encode()).digest()
    if answers and prompt in answers:
        return re.findall(r"\s*\S+", answers[prompt])[:n_tokens]
    if refuses and REFUSAL_TRIGGER in prompt:
        words = REFUSAL_TEXT.split()
        return [words[0]] + [" " + w for w in words[1:]]
    if ECHO_TRIGGER in prompt:
        return re.findall(r"\s*\S+", prompt.split(ECHO_TRIGGER, 1)[1].strip())[:n_tokens]
    tokens = [f"mock-{digest[:4].hex()}"]
    stream = digest
    while len(tokens) < n_tokens:
        stream = hashlib.sha256(stream).digest()
        tokens.extend(" " + _VOCAB[b % len(_VOCAB)] for b in stream)
    return tokens[:n_tokens]


def answer_text(prompt: str, n_tokens: int = 40, *, refuses: bool = True) -> str:
    """What the mock answers to `prompt` with an answer length of `n_tokens` (default 40)."""
    return "".join(answer_tokens(prompt, n_tokens, refuses=refuses))


# --- prompt usage, as OpenAI bills it --------------------------------------------------------------

# Per image, by model: (base tokens, tokens per 512-px tile) at high detail, from OpenAI's vision guide.
IMAGE_TILE_TOKENS = {"gpt-4o-mini": (2833, 5667), "gpt-4o": (85, 170), "gpt-4.1": (85, 170), "o1": (75, 150)}
DEFAULT_IMAGE_SIZE = (1024, 1024)  # an image only linked to: the mock cannot fetch it


def prompt_usage(body: dict) -> int:
    """Prompt tokens as OpenAI counts them for the model asked for (its tiktoken encoding, o200k_base
    when unknown): per message 3 tokens, its role, its content and its name (plus 1), 3 to prime the
    reply; tools rendered as the TypeScript namespace OpenAI puts in the system prompt; images by
    512-px tiles. So a test of Sentinel's reservations meets a realistic bill, in any script."""
    from gateway.limits.tokens import encoding

    model = str(body.get("model") or "")
    try:
        import tiktoken

        name = tiktoken.encoding_name_for_model(model)
    except KeyError:
        name = "o200k_base"
    tokenizer = encoding(name if name in ("o200k_base", "cl100k_base") else "o200k_base")

    def count(text: str) -> int:
        return len(tokenizer.encode_ordinary(text))

    total = 3
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        total += 3 + count(str(message.get("role") or ""))
        content = message.get("content")
        if isinstance(content, str):
            total += count(content)
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text":
                total += count(part.get("text") or "")
            elif part.get("type") == "image_url":
                total += _image_usage(model, part.get("image_url") or {})
        if message.get("name"):
            total += 1 + count(message["name"])
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            total += 3 + count(function.get("name") or "") + count(function.get("arguments") or "")
    if body.get("tools"):
        total += 9 + count(_tools_namespace(body["tools"]))
    return total


def _image_usage(model: str, image: dict) -> int:
    base, tile = next((v for k, v in IMAGE_TILE_TOKENS.items() if model.startswith(k)), (85, 170))
    if image.get("detail") == "low":
        return base
    width, height = _image_size(str(image.get("url") or ""))
    scale = min(1.0, 2048 / max(width, height))  # fit in 2048 x 2048, then the short side to 768
    width, height = width * scale, height * scale
    scale = min(1.0, 768 / min(width, height))
    return base + tile * math.ceil(width * scale / 512) * math.ceil(height * scale / 512)


def _image_size(url: str) -> tuple[int, int]:
    if not url.startswith("data:") or "," not in url:
        return DEFAULT_IMAGE_SIZE
    from PIL import Image

    try:
        with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as image:
            return image.size
    except (ValueError, OSError):
        return DEFAULT_IMAGE_SIZE


def _tools_namespace(tools: list) -> str:
    """Function tools as OpenAI renders them for the model (as reverse-engineered by the community's
    token counters, e.g. openai-chat-tokens)."""
    lines = ["# Tools", "", "## functions", "", "namespace functions {", ""]
    for tool in tools:
        function = tool.get("function") or {}
        if function.get("description"):
            lines.append(f"// {function['description']}")
        parameters = function.get("parameters") or {}
        if parameters.get("properties"):
            lines += [f"type {function.get('name')} = (_: {{", _ts_properties(parameters, ""), "}) => any;", ""]
        else:
            lines += [f"type {function.get('name')} = () => any;", ""]
    lines.append("} // namespace functions")
    return "\n".join(lines)


def _ts_properties(schema: dict, indent: str) -> str:
    required = set(schema.get("required") or ())
    lines = []
    for name, prop in (schema.get("properties") or {}).items():
        if prop.get("description"):
            lines.append(f"{indent}// {prop['description']}")
        lines.append(f"{indent}{name}{'' if name in required else '?'}: {_ts_type(prop, indent)},")
    return "\n".join(lines)


def _ts_type(prop: dict, indent: str) -> str:
    if "enum" in prop:
        return " | ".join(orjson.dumps(value).decode() for value in prop["enum"])
    kind = prop.get("type")
    if kind == "object" and prop.get("properties"):
        return "{\n" + _ts_properties(prop, indent + "  ") + f"\n{indent}}}"
    if kind == "array":
        return _ts_type(prop.get("items") or {}, indent) + "[]"
    if isinstance(kind, list):
        return " | ".join("number" if k == "integer" else str(k) for k in kind)
    return {"integer": "number", None: "any"}.get(kind, str(kind))
