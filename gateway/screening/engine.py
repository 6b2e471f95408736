"""Safety screening: personal data, prompt injection and moderation, on the way in and on the way out,
each check doing what the tenant's policy says (log, redact or block).

Where the pipeline calls it:
    screen_input(call)              after admission, before the cache: may block (400
                                    content_policy_violation, naming the checks, never the text) or
                                    rewrite call.body's messages (redacted spans become [EMAIL],
                                    [PAYMENT_CARD], ...), so the cache key, the cache entry and the
                                    provider only ever see the redacted text
    screen_response(call, response) a non-streamed answer: redacts in place, or withholds it
                                    (content "" and finish_reason "content_filter", as Azure OpenAI
                                    does; such an answer is never cached)
    a stream: gateway.screening.streaming.screen_stream(call, first, rest) (bounded holdback)

Local checks (gateway.screening.personal_data, .credentials, .injection, .moderation) are plain CPU
work: tens of microseconds on a typical prompt, a few milliseconds on thousands of characters (one
Hyperscan pass first rules out the patterns that cannot match, and tells those whose matches are
of bounded length where they can: gateway.screening.spans.Prefilter).
A text's findings are remembered by digest (remembered_spans), so a conversation's earlier turns,
sent again with every request, are not read again. Up to INLINE_CHARS of text in a request (or an
answer) they run on the event loop, about a millisecond per 1,000 characters: in a worker thread, a
4,000-character message that takes 3.5 ms alone took 0.3 to 17 s while the event loop was busy
(each Hyperscan match hands the interpreter back to the thread, which then waits for the loop to let
go of it; docs/screening.md). The second look of the injection check (a MiniLM pass over a chunk
the words are unsure of) is not run on the loop: the checks note the chunks, the embedder's own
thread embeds them (it lets go of the interpreter while it computes), and the checks run again with
the vectors. A request with more text than INLINE_CHARS is screened in a worker thread, so it does
not stop the loop for tens of milliseconds or more; on a saturated worker it waits long for its
turns (docs/screening.md). The outside services (a moderation provider
through litellm, the tenant's HTTP guardrail) run concurrently, on the already-redacted text, and
only when no local check blocked. Their outages follow the tenant's settings: by default input that
cannot be screened is refused (503 screening_unavailable) and an answer already generated is
delivered; both are counted (metrics, ledger).

Which texts: every text a request carries (gateway.screening.engine.segments: content strings, text
and refusal parts, the `name`, tool-call arguments) in every message. Personal data and secrets are
looked for in all of them; injection and moderation in all but the system/developer prompt (the
tenant's own instructions, which routinely say what to ignore and what is forbidden): user turns,
assistant turns and their tool calls (a client can forge the history), and tool results (how
injections arrive indirectly). A tenant without a policy costs one attribute test.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gateway import metrics
from gateway.errors import GatewayError
from gateway.screening import credentials, guardrail, injection, injection_model, moderation, personal_data, resources
from gateway.screening.personal_data import Span
from gateway.screening.policy import GUARDRAIL, INJECTION, MODERATION, Policy
from gateway.screening.spans import reading

log = logging.getLogger(__name__)
OFF, LOG, REDACT, BLOCK = "off", "log", "redact", "block"
IN, OUT = "in", "out"
SYSTEM_ROLES = frozenset({"system", "developer"})  # the tenant's own instructions: personal data only
MODERATION_CATEGORIES = frozenset(moderation.CATEGORIES)
CONTENT_FILTER = "content_filter"
# Up to this many characters of text in a request (or an answer), the local checks run on the event
# loop (at most about 30 ms of it, for text dense with findings); beyond, in a worker thread.
INLINE_CHARS = 32_000
_LOCAL_CHECKS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="screening")


def placeholder(check: str) -> str:
    return "[REDACTED]" if check == GUARDRAIL else f"[{check.upper()}]"


@dataclass
class Screening:
    """What screening did for one request, as its ledger row keeps it: check names, actions and
    moderation categories, never the text."""

    tenant: str
    ran_in: list[str] = field(default_factory=list)
    ran_out: list[str] = field(default_factory=list)
    fired: dict[tuple[str, str], str] = field(default_factory=dict)  # (check, direction) -> action
    categories: set[str] = field(default_factory=set)
    outages: list[tuple[str, str, str]] = field(default_factory=list)  # (check, direction, open|closed)
    guardrail_ms: int | None = None

    def fire(self, check: str, direction: str, action: str) -> None:
        """Once per check and direction per request (a stream rescans its window, a prompt may
        hold several e-mail addresses: one decision). Blocking outranks redacting outranks logging."""
        key = (check, direction)
        previous = self.fired.get(key)
        if previous is not None and _RANK[previous] >= _RANK[action]:
            return
        self.fired[key] = action
        metrics.screening_decision(self.tenant, check, direction, action)

    def outage(self, check: str, direction: str, fail_open: bool, error: BaseException) -> None:
        outcome = "open" if fail_open else "closed"
        self.outages.append((check, direction, outcome))
        metrics.screening_outage(self.tenant, check, direction, outcome)
        # The reason's kind only (timeout, status 500, ConnectionError): never the text screened.
        reason = (
            str(error) if isinstance(error, moderation.ModerationUnavailable | guardrail.GuardrailUnavailable) else ""
        )
        log.warning(
            "screening: %s unavailable, failing %s",
            check,
            outcome,
            extra={"tenant": self.tenant, "direction": direction, "reason": reason or type(error).__name__},
        )

    def summary(self) -> dict:
        result: dict = {"in": self.ran_in}
        if self.ran_out:
            result["out"] = self.ran_out
        if self.fired:
            result["fired"] = [[check, direction, action] for (check, direction), action in self.fired.items()]
        if self.categories:
            result["categories"] = sorted(self.categories)
        if self.outages:
            result["outages"] = [list(item) for item in self.outages]
        if self.guardrail_ms is not None:
            result["guardrail_ms"] = self.guardrail_ms
        return result


_RANK = {LOG: 0, REDACT: 1, BLOCK: 2}


def summary(call) -> dict | None:
    """The ledger's `screening` field for a request (None when it was not screened)."""
    return call.screening.summary() if call.screening is not None else None


# --- text in messages --------------------------------------------------------------------------


@dataclass
class Text:
    """One text a request carries, and where it sits in the messages (`path`: keys and indexes from
    the message down, e.g. ("tool_calls", 0, "function", "arguments"))."""

    index: int
    path: tuple
    role: str
    text: str
    arguments: object = None  # tool-call arguments: the parsed JSON (screened as its canonical text)

    @property
    def checked(self) -> str:
        """What the checks read: the text, with JSON escapes (\\n, \\", \\u0001) blanked in
        arguments, same length (spans map back one to one). Read as text, "\\nAIza..." is a word
        character before the key, and a pattern that must not start inside a word would skip it."""
        return self.text if self.arguments is None else _JSON_ESCAPE.sub(lambda m: " " * len(m.group()), self.text)

    @property
    def param(self) -> str:
        """OpenAI's way of naming the field: messages[1].tool_calls[0].function.arguments."""
        name = f"messages[{self.index}]"
        for step in self.path:
            name += f"[{step}]" if isinstance(step, int) else f".{step}"
        return name


_NO_ARGUMENTS = object()
_JSON_ESCAPE = re.compile(r'\\(?:u[0-9a-fA-F]{4}|["\\/bfnrt])')


def _arguments(raw: str) -> object:
    """Tool-call arguments as JSON, or _NO_ARGUMENTS when they are not JSON."""
    try:
        return json.loads(raw)
    except ValueError:
        return _NO_ARGUMENTS


def segments(messages: list) -> list[Text]:
    """Every text in the messages: string content, text and refusal parts, the `name`, the
    arguments of an assistant's tool calls (and of a legacy function_call). Tool-call arguments
    that are JSON are screened as their canonical text (no \\u escapes, so `m\\u00fcller.de` is read
    as `müller.de`)."""
    found = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        role, content = message.get("role", ""), message.get("content")
        if isinstance(content, str):
            if content:
                found.append(Text(i, ("content",), role, content))
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict):
                    continue
                for field_name in ("text", "refusal"):
                    if isinstance(part.get(field_name), str) and part[field_name]:
                        found.append(Text(i, ("content", j, field_name), role, part[field_name]))
        if isinstance(message.get("name"), str) and message["name"]:
            found.append(Text(i, ("name",), role, message["name"]))
        calls = message.get("tool_calls")
        for k, tool_call in enumerate(calls if isinstance(calls, list) else ()):
            function = tool_call.get("function") if isinstance(tool_call, dict) else None
            if isinstance(function, dict):
                found.extend(_arguments_text(i, ("tool_calls", k, "function", "arguments"), role, function))
        legacy = message.get("function_call")
        if isinstance(legacy, dict):
            found.extend(_arguments_text(i, ("function_call", "arguments"), role, legacy))
    return found


def _arguments_text(i: int, path: tuple, role: str, function: dict) -> list[Text]:
    raw = function.get("arguments")
    if not isinstance(raw, str) or not raw:
        return []
    parsed = _arguments(raw)
    if parsed is _NO_ARGUMENTS:
        return [Text(i, path, role, raw)]
    return [Text(i, path, role, json.dumps(parsed, ensure_ascii=False), arguments=parsed)]


def _write(messages: list, text: Text, spans: list[Span]) -> None:
    """Mask `spans` in `text` and put the result where the text came from (and in `text`)."""
    masked, _ = mask(text.text, spans, bare=text.path == ("name",))  # a name allows [A-Za-z0-9_-] only
    if text.arguments is not None:
        parsed = _arguments(masked)
        if parsed is _NO_ARGUMENTS:
            # A span crossed the JSON's syntax: mask each string in the arguments on its own instead.
            parsed = _mask_strings(text.arguments, {span.check for span in spans})
            masked = json.dumps(parsed, ensure_ascii=False)
        text.arguments = parsed
    text.text = masked
    target = messages[text.index]
    for step in text.path[:-1]:
        target = target[step]
    target[text.path[-1]] = masked


def _mask_strings(value: object, checks: set[str]) -> object:
    """Every string in a JSON value masked on its own for the checks that fired on the whole; a
    value no personal-data check can find again on its own (a guardrail's span) is masked whole."""
    kinds = tuple(checks & set(personal_data.KINDS))
    if len(kinds) < len(checks):
        return placeholder(GUARDRAIL)
    if isinstance(value, str):
        found = personal_data.find(value, kinds)
        return mask(value, found)[0] if found else value
    if isinstance(value, list):
        return [_mask_strings(item, checks) for item in value]
    if isinstance(value, dict):
        return {key: _mask_strings(item, checks) for key, item in value.items()}
    return value


def mask(text: str, spans: list[Span], cut: int | None = None, *, bare: bool = False) -> tuple[str, int]:
    """`text` with each span replaced by its placeholder (`bare`: without brackets); also where
    `cut` (a position in `text`) lands in the result (past a placeholder that straddles it)."""
    cut = len(text) if cut is None else cut
    pieces, position, new_cut = [], 0, None
    for span in sorted(spans, key=lambda s: s.start):
        if span.start < position:
            continue  # overlaps one already masked
        if new_cut is None and cut <= span.start:
            new_cut = sum(map(len, pieces)) + (cut - position)
        pieces.append(text[position : span.start])
        pieces.append(placeholder(span.check).strip("[]") if bare else placeholder(span.check))
        position = span.end
        if new_cut is None and cut < span.end:
            new_cut = sum(map(len, pieces))
    if new_cut is None:
        new_cut = sum(map(len, pieces)) + max(cut - position, 0)
    pieces.append(text[position:])
    return "".join(pieces), new_cut


def local_spans(
    text: str, *, kinds: tuple[str, ...], injection_on: bool, moderation_on: bool, region: str
) -> list[Span]:
    """Every local check's findings in one text. Moderation findings keep their category as
    `check` (violence, self-harm, ...)."""
    # A run of digits repeated in the text is handed to the phone matcher once.
    with personal_data.remembering_numbers(), reading(text):
        spans = personal_data.find(text, kinds, region=region) if kinds else []
        if injection_on:
            spans.extend(injection.find(text))
        if moderation_on:
            spans.extend(moderation.find(text))
    return spans


# A conversation sends its earlier turns again with every request: their findings are kept, keyed by
# a digest of the text and of what was asked (never the text itself), so only the new turn is read.
SPANS_CACHE_SIZE = 4096
_spans_cache: OrderedDict[bytes, tuple[Span, ...]] = OrderedDict()
_spans_cache_lock = threading.Lock()


def remembered_spans(
    text: str, *, kinds: tuple[str, ...], injection_on: bool, moderation_on: bool, region: str
) -> list[Span]:
    """local_spans, remembered for the last SPANS_CACHE_SIZE texts screened (per process)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16)
    digest.update(repr((kinds, injection_on, moderation_on, region)).encode())
    key = digest.digest()
    with _spans_cache_lock:
        known = _spans_cache.get(key)
        if known is not None:
            _spans_cache.move_to_end(key)
            return list(known)
    unresolved = injection_model.deferred_count()
    spans = local_spans(text, kinds=kinds, injection_on=injection_on, moderation_on=moderation_on, region=region)
    if injection_model.deferred_count() > unresolved:
        return spans  # the second look is still to come: not remembered
    with _spans_cache_lock:
        _spans_cache[key] = tuple(spans)
        if len(_spans_cache) > SPANS_CACHE_SIZE:
            _spans_cache.popitem(last=False)
    return spans


def compile_prefilters(timeout: float | None = None) -> bool:
    """Compile every check's Hyperscan prefilter now (about 2 s of CPU in all, once per process),
    rather than on the first long text; whether all are ready."""
    modules = (credentials, injection, moderation, personal_data)
    return all([module._PREFILTER.compile(timeout) for module in modules] + [injection._CUES.compile()])


def forget_spans() -> None:
    """Empty the cache of findings (the benchmark times the checks themselves with it)."""
    with _spans_cache_lock:
        _spans_cache.clear()


def check_of(span: Span) -> str:
    return MODERATION if span.check in MODERATION_CATEGORIES else span.check


# --- input -------------------------------------------------------------------------------------


def blocked(checks: list[str], param: str | None) -> GatewayError:
    names = ", ".join(dict.fromkeys(checks))
    where = f" in {param}" if param else ""
    return GatewayError(
        400,
        "content_policy_violation",
        f"This request was blocked by the tenant's content policy (check: {names}){where}.",
        param=param,
    )


def unavailable(check: str) -> GatewayError:
    return GatewayError(
        503,
        "screening_unavailable",
        f"The {check} service could not screen this request, and this tenant's policy refuses input it "
        "cannot screen. Retry later.",
        headers={"retry-after": "1"},
    )


async def screen_input(call) -> None:
    """Screen the request's messages before the cache and the provider see them (see the module)."""
    policy: Policy | None = call.key.screening
    if policy is None:
        return
    record = call.screening = Screening(tenant=call.key.tenant_slug)
    record.ran_in = [name for name, _ in policy.input]
    messages = call.body["messages"]
    texts = segments(messages)
    if sum(len(text.text) for text in texts) > INLINE_CHARS:
        found = await asyncio.get_running_loop().run_in_executor(_LOCAL_CHECKS, _findings, policy, texts)
    else:
        found = await _local_findings(policy, texts)
    blocks = _act_locally(policy, record, messages, texts, found)
    if blocks:
        raise blocked([check for check, _ in blocks], blocks[0][1])
    await _screen_input_remotely(call, policy, record, texts, policy.action(MODERATION))


async def _local_findings(policy: Policy, texts: list[Text]) -> list[list[Span]]:
    """Every local check's findings in each text, on this thread (the event loop). Chunks the
    injection check's second look wants embedded are embedded by the embedder's thread, and the
    texts are read again with their vectors (findings with an embedding still missing are never
    remembered). If the embedder fails, the words alone decide, as in a process without it."""
    ahead = injection_model.Embeddings()
    with injection_model.deferring_second_look(ahead):
        found = _findings(policy, texts)
    if not ahead.wanted:
        return found
    from gateway.cache.engine import embed_many

    wanted = list(dict.fromkeys(ahead.wanted))
    try:
        vectors = await embed_many(wanted)
    except Exception as exc:  # noqa: BLE001 - a second look lost: the words have judged
        log.warning("injection second look skipped: %s: %s", type(exc).__name__, exc)
        return found
    ahead.vectors.update(zip(wanted, vectors, strict=True))
    ahead.wanted.clear()
    with injection_model.deferring_second_look(ahead):
        return _findings(policy, texts)


def _findings(policy: Policy, texts: list[Text]) -> list[list[Span]]:
    kinds = policy.personal_data_kinds
    injection_action, moderation_action = policy.action(INJECTION), policy.action(MODERATION)
    return [
        remembered_spans(
            text.checked,
            kinds=kinds,
            injection_on=injection_action != OFF and text.role not in SYSTEM_ROLES,
            moderation_on=moderation_action != OFF and text.role not in SYSTEM_ROLES,
            region=policy.phone_region,
        )
        for text in texts
    ]


def _act_locally(
    policy: Policy, record: Screening, messages: list, texts: list[Text], found: list[list[Span]]
) -> list[tuple[str, str]]:
    """What the policy does with the local checks' findings: redactions written into the messages;
    the blocks returned as (check, param)."""
    blocks: list[tuple[str, str]] = []
    for text, spans in zip(texts, found, strict=True):
        redact = []
        for span in spans:
            check = check_of(span)
            if check == MODERATION:
                record.categories.add(span.check)
            action = policy.action(check)
            record.fire(check, IN, action)
            if action == BLOCK:
                blocks.append((check, text.param))
            elif action == REDACT:
                redact.append(Span(check, span.start, span.end))
        if redact:
            _write(messages, text, redact)
    return blocks


async def _screen_input_remotely(call, policy: Policy, record: Screening, texts: list, moderation_action: str) -> None:
    """The moderation provider and the guardrail, concurrently, on the redacted text."""
    provider = await resources.moderation_provider(policy) if moderation_action != OFF else None
    moderated = "\n\n".join(text.text for text in texts if text.role not in SYSTEM_ROLES)
    jobs: dict[str, Awaitable] = {}
    if provider is not None and moderated:
        jobs[MODERATION] = moderation.moderate(provider, moderated)
    if policy.guardrail_url and texts:
        secret = await resources.guardrail_secret(call.key.tenant_id)
        jobs[GUARDRAIL] = guardrail.consult(
            url=policy.guardrail_url,
            secret=secret,
            timeout=policy.guardrail_timeout,
            request_id=call.request_id,
            tenant=call.key.tenant_slug,
            texts=[(text.role, text.text) for text in texts],
        )
    if not jobs:
        return
    results = dict(zip(jobs, await asyncio.gather(*jobs.values(), return_exceptions=True), strict=True))
    refusals: list[str] = []
    outage: str | None = None
    flagged = results.get(MODERATION)
    if isinstance(flagged, BaseException):
        record.outage(MODERATION, IN, policy.moderation_input_fail_open, flagged)
        outage = None if policy.moderation_input_fail_open else MODERATION
    elif flagged:
        record.categories.update(flagged)
        action = BLOCK if moderation_action == REDACT else moderation_action  # a verdict has no span
        record.fire(MODERATION, IN, action)
        if action == BLOCK:
            refusals.append(MODERATION)
    answer = results.get(GUARDRAIL)
    if isinstance(answer, BaseException):
        record.outage(GUARDRAIL, IN, policy.guardrail_fail_open, answer)
        outage = outage or (None if policy.guardrail_fail_open else GUARDRAIL)
    elif answer is not None:
        verdict, elapsed = answer
        record.guardrail_ms = int(elapsed * 1000)
        if verdict.action == "block":
            record.fire(GUARDRAIL, IN, BLOCK)
            refusals.append(GUARDRAIL)
        elif verdict.action == "redact" and verdict.redactions:
            record.fire(GUARDRAIL, IN, REDACT)
            _apply_guardrail_redactions(call.body["messages"], texts, verdict)
    if refusals:
        raise blocked(refusals, None)
    if outage:
        raise unavailable(outage)


def _apply_guardrail_redactions(messages: list, texts: list[Text], verdict: guardrail.Verdict) -> None:
    for text_id, spans in _redactions_by_text(verdict).items():
        _write(messages, texts[text_id], spans)


def _redactions_by_text(verdict: guardrail.Verdict) -> dict[int, list[Span]]:
    by_text: dict[int, list[Span]] = {}
    for text_id, start, end in verdict.redactions:
        by_text.setdefault(text_id, []).append(Span(GUARDRAIL, start, end))
    return by_text


# --- output ------------------------------------------------------------------------------------


def output_spans(policy: Policy, text: str) -> list[Span]:
    return local_spans(
        text,
        kinds=personal_data.KINDS if policy.output_personal_data != OFF else (),
        injection_on=False,
        moderation_on=policy.output_moderation != OFF,
        region=policy.phone_region,
    )


def output_action(policy: Policy, check: str) -> str:
    action = policy.output_moderation if check == MODERATION else policy.output_personal_data
    return action


def withhold(choice: dict) -> None:
    message = choice.get("message")
    if isinstance(message, dict):
        message["content"] = ""
    choice["finish_reason"] = CONTENT_FILTER


def _output_record(call, policy: Policy) -> Screening:
    """The request's screening record (started at input, or now), with the output checks that run."""
    record = call.screening or Screening(tenant=call.key.tenant_slug)
    call.screening = record
    record.ran_out = policy.output_checks
    return record


def _output_decisions(policy: Policy, record: Screening, spans: list[Span]) -> tuple[list[str], list[Span]]:
    """What the output checks decide on one text's findings, recorded: the checks that block it, and
    the spans to redact."""
    blocks, redact = [], []
    for span in spans:
        check = check_of(span)
        if check == MODERATION:
            record.categories.add(span.check)
        action = output_action(policy, check)
        record.fire(check, OUT, action)
        if action == BLOCK:
            blocks.append(check)
        elif action == REDACT:
            redact.append(Span(check, span.start, span.end))
    return blocks, redact


async def screen_images(call, response: dict) -> GatewayError | None:
    """Screen generated images once made (gateway.images): each revised prompt by the output checks
    (redacted in place), then the tenant's guardrail, shown the prompt, the revised prompts and each
    image's URL or, for an inline one, its format, size and digest (never the image itself). Returns
    the refusal to answer with instead of the images (they were made: the request is billed), or None."""
    policy: Policy | None = call.key.screening
    if policy is None or not (policy.screens_output or policy.guardrail_url):
        return None
    record = _output_record(call, policy)
    items = response["data"]
    revised = [item for item in items if item.get("revised_prompt")]
    refusals: list[str] = []
    if policy.screens_output:
        for item in revised:
            blocks, redact = _output_decisions(policy, record, output_spans(policy, item["revised_prompt"]))
            refusals += blocks
            if redact:
                item["revised_prompt"], _ = mask(item["revised_prompt"], redact)
    if refusals:
        return _withheld(refusals)
    if not policy.guardrail_url:
        return None
    # A variation has no prompt: the guardrail is shown an empty one (text 0, as for the others).
    prompt = call.body.get("prompt") or ""
    texts = [("user", prompt)] + [("revised_prompt", item["revised_prompt"]) for item in revised]
    try:
        verdict, elapsed = await guardrail.consult(
            url=policy.guardrail_url,
            secret=await resources.guardrail_secret(call.key.tenant_id),
            timeout=policy.guardrail_timeout,
            request_id=call.request_id,
            tenant=call.key.tenant_slug,
            texts=texts,
            stage="output",
            images=[image_facts(index, item) for index, item in enumerate(items)],
        )
    except guardrail.GuardrailUnavailable as error:
        record.outage(GUARDRAIL, OUT, policy.guardrail_fail_open, error)
        return None if policy.guardrail_fail_open else unavailable(GUARDRAIL)
    record.guardrail_ms = (record.guardrail_ms or 0) + int(elapsed * 1000)
    if verdict.action == "block" or any(text_id == 0 for text_id, _, _ in verdict.redactions):
        # A span of the prompt cannot be taken out of an image made from it.
        record.fire(GUARDRAIL, OUT, BLOCK)
        return _withheld([GUARDRAIL])
    if verdict.action == "redact" and verdict.redactions:
        record.fire(GUARDRAIL, OUT, REDACT)
        for text_id, spans in _redactions_by_text(verdict).items():
            item = revised[text_id - 1]
            item["revised_prompt"], _ = mask(item["revised_prompt"], spans)
    return None


def image_facts(index: int, item: dict) -> dict:
    """What the guardrail is told of one image: its URL, or for an inline one (base64 or a data URL)
    its format, size in bytes and SHA-256."""
    url = item.get("url") or ""
    if url and not url.startswith("data:"):
        return {"index": index, "url": url}
    media, _, encoded = url.partition(",") if url else ("data:image/png;base64", ",", item.get("b64_json") or "")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    image_format = media.removeprefix("data:").split(";")[0].removeprefix("image/") or "png"
    return {"index": index, "format": image_format, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


def _withheld(checks: list[str]) -> GatewayError:
    names = ", ".join(dict.fromkeys(checks))
    return GatewayError(
        400,
        "content_policy_violation",
        f"The generated images were withheld by the tenant's content policy (check: {names}).",
    )


async def screen_response(call, response: dict) -> None:
    """Screen a non-streamed answer in place: redact spans, or withhold an answer a block fired on."""
    policy: Policy | None = call.key.screening
    if policy is None or not policy.screens_output:
        return
    record = _output_record(call, policy)
    choices = [c for c in response.get("choices") or () if isinstance(c, dict)]
    delivered = []
    for choice in choices:
        message = choice.get("message") or {}
        content = message.get("content")
        if not isinstance(content, str) or not content:
            continue
        if len(content) > INLINE_CHARS:
            spans = await asyncio.get_running_loop().run_in_executor(_LOCAL_CHECKS, output_spans, policy, content)
        else:
            spans = output_spans(policy, content)
        blocks, redact = _output_decisions(policy, record, spans)
        if blocks:
            withhold(choice)
            continue
        if redact:
            message["content"], _ = mask(content, redact)
        delivered.append(choice)
    provider = await resources.moderation_provider(policy) if policy.output_moderation != OFF else None
    if provider is None or not delivered:
        return
    try:
        flagged = await moderation.moderate(provider, "\n\n".join(c["message"]["content"] for c in delivered))
    except moderation.ModerationUnavailable as error:
        record.outage(MODERATION, OUT, policy.moderation_output_fail_open, error)
        if not policy.moderation_output_fail_open:
            for choice in delivered:
                withhold(choice)
        return
    if flagged:
        record.categories.update(flagged)
        action = LOG if policy.output_moderation == LOG else BLOCK
        record.fire(MODERATION, OUT, action)
        if action == BLOCK:
            for choice in delivered:
                withhold(choice)
