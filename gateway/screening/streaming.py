"""Screening a streamed answer as it flows, holding back at most a bounded window.

Each choice's content is relayed with its last `window` characters (the policy's stream_window,
64 by default, 32 to 1024, and never less than MIN_HOLD) held back: a finding that starts before the
held-back part has, by then, `window` characters after its start in view, so any card number, IBAN,
phone number or e-mail address no longer than that is caught whole even when it arrives split
across chunks, and the client never receives a piece of it. Two kinds of finding can be longer, and
are held back until they end:
- a token still arriving (the text ends inside a run of token characters: an API key, a JWT, an
  e-mail address) is held whole, up to MAX_TOKEN characters, so a 93-character GitHub token or a
  long JWT is judged complete, never cut at the window;
- a private key is held from its BEGIN line until its END line (or the end of the answer), then
  masked whole.
Otherwise the text is never delayed by more than the window, and is released in full with the
finish reason.

A block (the policy's output action) ends the choice there with finish_reason "content_filter";
what the provider still sends is read (for its usage, which is billed) and dropped. Provider
moderation does not run on streams (it would need the whole answer); the local checks do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from gateway.screening.credentials import unterminated_private_key
from gateway.screening.engine import (
    BLOCK,
    CONTENT_FILTER,
    MODERATION,
    OUT,
    REDACT,
    Screening,
    check_of,
    mask,
    output_action,
)
from gateway.screening.engine import output_spans as find_output_spans
from gateway.screening.personal_data import Span, remembering_numbers
from gateway.screening.policy import Policy
from gateway.upstream.transport import Event

CONTEXT = 128  # characters already released, kept as context for patterns that look behind (key = ...)
MIN_HOLD = 48  # the longest finding with spaces in it: an IBAN of 34 characters in groups of four
MAX_TOKEN = 4096  # a run of token characters longer than this is released at the window after all
# What a token, an e-mail address or a JWT is made of: a run of these at the end of the held-back
# text may not be complete yet.
_TOKEN_CHARS = frozenset("@.+/=%~:'_-")


@dataclass
class _Choice:
    pending: str = ""  # received, not yet released
    context: str = ""  # the end of what was released
    blocked: bool = False


class StreamScreen:
    def __init__(self, policy: Policy, record: Screening) -> None:
        self.policy = policy
        self.record = record
        self.window = max(policy.stream_window, MIN_HOLD)
        self.choices: dict[int, _Choice] = {}
        self._numbers: dict = {}  # what the phone matcher made of this stream's digit runs
        record.ran_out = policy.output_checks

    def screened(self, first: Event, rest: AsyncIterator[Event]) -> tuple[Event, AsyncIterator[Event]]:
        """The first event becomes a role-only chunk (its content, if any, joins the window)."""
        head = {k: v for k, v in first.data.items() if k not in ("choices", "usage")}
        head["choices"] = [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
        return Event(head), self._run(first, rest)

    async def _run(self, first: Event, rest: AsyncIterator[Event]) -> AsyncIterator[Event]:
        try:
            chunk = self.feed(first.data)
            if chunk is not None:
                yield Event(chunk)
            last = first.data
            async for event in rest:
                last = event.data
                chunk = self.feed(event.data)
                if chunk is not None:
                    yield Event(chunk)
            tail = self.flush(last)
            if tail is not None:
                yield Event(tail)
        finally:
            await rest.aclose()

    def feed(self, data: dict) -> dict | None:
        """One provider chunk in; the chunk to relay (None when there is nothing to relay yet)."""
        out_choices = []
        for choice in data.get("choices") or ():
            index = choice.get("index", 0)
            state = self.choices.setdefault(index, _Choice())
            if state.blocked:
                continue
            delta = dict(choice.get("delta") or {})
            finish = choice.get("finish_reason")
            state.pending += delta.pop("content", None) or ""
            delta.pop("role", None)
            released = self._release(state, final=finish is not None)
            if state.blocked:
                out_choices.append({"index": index, "delta": {}, "finish_reason": CONTENT_FILTER})
                continue
            if released:
                delta["content"] = released
            if delta or finish is not None:
                out_choices.append({**choice, "delta": delta, "finish_reason": finish})
        if out_choices:
            return {**data, "choices": out_choices}
        if data.get("usage"):
            return {**data, "choices": []}
        return None

    def flush(self, last: dict) -> dict | None:
        """The stream ended without a finish reason: release what is held."""
        out_choices = []
        for index, state in self.choices.items():
            if state.blocked or not state.pending:
                continue
            released = self._release(state, final=True)
            if state.blocked:
                out_choices.append({"index": index, "delta": {}, "finish_reason": CONTENT_FILTER})
            elif released:
                out_choices.append({"index": index, "delta": {"content": released}, "finish_reason": None})
        if not out_choices:
            return None
        return {k: v for k, v in last.items() if k not in ("choices", "usage")} | {"choices": out_choices}

    def _release(self, state: _Choice, *, final: bool) -> str:
        """Scan the held-back text and release all but the window (everything when final)."""
        text = state.pending
        if not text:
            return ""
        cut = len(text) if final else self._cut(state.context, text)
        if cut == 0:
            return ""
        offset = len(state.context)
        redact = []
        with remembering_numbers(self._numbers):  # the text before is screened again: its numbers are known
            found = find_output_spans(self.policy, state.context + text)
        for span in found:
            start, end = span.start - offset, span.end - offset
            if end <= 0 or start >= cut:
                continue  # already released, or not complete enough to judge yet
            check = check_of(span)
            if check == MODERATION:
                self.record.categories.add(span.check)
            action = output_action(self.policy, check)
            self.record.fire(check, OUT, action)
            if action == BLOCK:
                state.blocked, state.pending = True, ""
                return ""
            if action == REDACT:
                redact.append(Span(check, max(start, 0), end))
        if redact:
            text, cut = mask(text, redact, cut)
        released, state.pending = text[:cut], text[cut:]
        state.context = (state.context + released)[-CONTEXT:]
        return released

    def _cut(self, context: str, text: str) -> int:
        """How much of the held-back text may go now: all but the window, less a token still
        arriving, less a private key from its BEGIN line until its END line has arrived."""
        key = unterminated_private_key(context + text)
        if key is not None:
            return max(0, key - len(context))
        cut = max(0, len(text) - self.window)
        run = len(text)
        while run > 0 and len(text) - run < MAX_TOKEN and _is_token_char(text[run - 1]):
            run -= 1
        if run < cut and len(text) - run < MAX_TOKEN:
            cut = run
        return cut


def _is_token_char(char: str) -> bool:
    return char.isalnum() or char in _TOKEN_CHARS


def screen_stream(call, first, rest):
    """(first, rest) of a stream, screened as it goes when the tenant screens answers."""
    policy: Policy | None = call.key.screening
    if policy is None or not policy.screens_output:
        return first, rest
    if call.screening is None:
        call.screening = Screening(tenant=call.key.tenant_slug)
    return StreamScreen(policy, call.screening).screened(first, rest)
