"""Secrets in text: API keys, tokens, private keys and passwords, as spans that cover the whole value.

The rules are detect-secrets' where it has them (its detectors' token formats, and its
KeywordDetector's assignment forms: `password = ...`, `api_key: ...`, `AWS_SECRET_ACCESS_KEY=...`,
quoted or not, as config files, YAML, .env files and code write them), plus, hand-written, the
formats of major providers it does not know (fine-grained GitHub tokens, current OpenAI and
Anthropic keys, Google, Azure, Hugging Face, npm, Shopify, DigitalOcean, Databricks, Vault, Groq,
Replicate, ..., Sentinel's own), `Authorization: Bearer` values, assignments to names that say
token or access key, and a password stated in prose.

A match only says where a secret is; the span masked is then widened to the whole token it sits in
(detect-secrets' GitHub and GitLab patterns capture the prefix, its JWT pattern stops before the
signature, its fixed-length patterns stop inside a longer token), so nothing of the value is left
beside the placeholder. A value found by its name alone (`secret = ...`) must look like a credential
(no spaces, a letter and a digit or symbol, not a placeholder such as `${TOKEN}` or `<your key>`),
so prose such as "password: at least 12 characters" is not one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from detect_secrets.filters.heuristic import is_templated_secret
from detect_secrets.plugins import keyword
from detect_secrets.plugins.artifactory import ArtifactoryDetector
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

from gateway.screening.spans import Prefilter, Span

SECRET = "secret"  # noqa: S105 - the kind of span, not a secret

# detect-secrets detectors whose capturing group is the secret value after a name or a user
# (`aws ... key = "<value>"`, `://user:<value>@`, `_authToken=<value>`); in the others a group,
# when there is one, is the token's prefix and the whole match is the token.
_VALUE_GROUP = (AWSKeyDetector, BasicAuthDetector, NpmDetector)
_DETECT_SECRETS = (
    ArtifactoryDetector,
    AWSKeyDetector,
    AzureStorageKeyDetector,
    BasicAuthDetector,
    DiscordBotTokenDetector,
    GitHubTokenDetector,
    GitLabTokenDetector,
    MailchimpDetector,
    NpmDetector,
    OpenAIDetector,
    PypiTokenDetector,
    SendGridDetector,
    SlackDetector,
    SquareOAuthDetector,
    StripeDetector,
    TelegramBotTokenDetector,
    TwilioKeyDetector,
)
# Formats detect-secrets 1.5 does not know. Each starts with the literal it consumes and then looks
# behind it for a word character, so the regex engine jumps to candidate positions (see personal_data).
_PROVIDER_FORMATS = (
    r"github_pat_(?<!\wgithub_pat_)[A-Za-z0-9_]{60,}",  # GitHub fine-grained personal access token
    # OpenAI, Anthropic, OpenRouter, Sentinel
    r"sk-(?<!\wsk-)(?:proj-|svcacct-|admin-|ant-(?:api|admin)\d\d-|sen-|or-v1-)?[A-Za-z0-9_-]{20,}",
    r"AIza(?<!\wAIza)[0-9A-Za-z_-]{35}",  # Google API key
    r"GOCSPX-(?<!\wGOCSPX-)[0-9A-Za-z_-]{20,}",  # Google OAuth client secret
    r"ya29\.(?<!\wya29\.)[0-9A-Za-z_-]{20,}",  # Google OAuth access token
    r"hf_(?<!\whf_)[A-Za-z0-9]{30,}",  # Hugging Face
    r"api_org_(?<!\wapi_org_)[A-Za-z0-9]{30,}",  # Hugging Face organisation
    r"xai-(?<!\wxai-)[A-Za-z0-9]{40,}",  # xAI
    r"gsk_(?<!\wgsk_)[A-Za-z0-9]{40,}",  # Groq
    r"r8_(?<!\wr8_)[A-Za-z0-9]{30,}",  # Replicate
    r"pplx-(?<!\wpplx-)[A-Za-z0-9]{40,}",  # Perplexity
    r"[sr]k_(?<!\w[sr]k_)(?:live|test)_[0-9a-zA-Z]{24,}",  # Stripe secret and restricted keys
    r"whsec_(?<!\wwhsec_)[0-9a-zA-Z]{24,}",  # Stripe webhook signing secret
    r"npm_(?<!\wnpm_)[A-Za-z0-9]{36}",  # npm
    r"shp(?<!\wshp)(?:at|ca|pa|ss)_[a-fA-F0-9]{32}",  # Shopify
    r"do(?<!\wdo)[opr]_v1_[a-f0-9]{64}",  # DigitalOcean
    r"dapi(?<!\wdapi)[a-f0-9]{32}",  # Databricks
    r"hv(?<!\whv)[sb]\.[A-Za-z0-9_-]{24,}",  # HashiCorp Vault
    r"glsa_(?<!\wglsa_)[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}",  # Grafana service account
    r"lin_api_(?<!\wlin_api_)[A-Za-z0-9]{40}",  # Linear
    r"ntn_(?<!\wntn_)[A-Za-z0-9]{40,}",  # Notion
    r"sntry[su]_(?<!\wsntry[su]_)[A-Za-z0-9+/=_-]{40,}",  # Sentry
    r"PMAK-(?<!\wPMAK-)[a-f0-9]{24}-[a-f0-9]{34}",  # Postman
    r"dp\.(?<!\wdp\.)(?:pt|st|sa|ct)\.[A-Za-z0-9]{40,}",  # Doppler
    r"xapp-(?<!\wxapp-)\d-[A-Z0-9]+-\d+-[a-z0-9]+",  # Slack app-level token
    r"ATATT(?<!\wATATT)[A-Za-z0-9_=-]{100,}",  # Atlassian API token
    r"[A-Za-z0-9_~.-]{3}\dQ~[A-Za-z0-9_~.-]{31,34}",  # Azure AD client secret
    r"SharedAccessSignature(?:\s+|=)sr=[^\s\"']+",  # Azure SAS connection string
    r"(?<![\w-])sig=[A-Za-z0-9%+/]{40,}={0,2}",  # Azure SAS URL signature
)
# Patterns Python's engine cannot skip through (they start with a character class or a group), each
# tried only on text that holds one of its literals (a substring search).
_LITERALS: dict[object, tuple[str, ...]] = {
    ArtifactoryDetector: ("AKC", "AP"),
    DiscordBotTokenDetector: (".",),
    MailchimpDetector: ("-us",),
    SlackDetector: ("xox", "hooks.slack.com"),
    StripeDetector: ("k_live_",),
    TelegramBotTokenDetector: (":",),
    r"[A-Za-z0-9_~.-]{3}\dQ~[A-Za-z0-9_~.-]{31,34}": ("Q~",),
    r"(?<![\w-])sig=[A-Za-z0-9%+/]{40,}={0,2}": ("sig=",),
}
_TOKEN_PATTERNS: tuple[tuple[tuple[str, ...], re.Pattern], ...] = tuple(
    (_LITERALS.get(detector, ()), pattern)
    for detector in _DETECT_SECRETS
    for pattern in detector().denylist
    if not (detector in _VALUE_GROUP and pattern.groups)
) + tuple((_LITERALS.get(pattern, ()), re.compile(pattern)) for pattern in _PROVIDER_FORMATS)
_VALUE_PATTERNS: tuple[tuple[tuple[str, ...], re.Pattern], ...] = tuple(
    ((), pattern) for detector in _VALUE_GROUP for pattern in detector().denylist if pattern.groups
) + (
    # A password in a URL with the characters detect-secrets' BasicAuth pattern leaves out (#, !, ...),
    # and curl's -u user:password.
    (("://",), re.compile(r"://[^\s:/?#\[\]@]+:([^\s/@]{3,})@[\w.-]")),
    (("-u", "--user"), re.compile(r"(?<!\S)(?:-u|--user)\s+[\w.@-]+:([^\s'\"]{3,})")),
)
_JWT = JwtTokenDetector()
_JWT_PATTERN = _JWT.denylist[0]
_PRIVATE_KEY_BEGIN = re.compile(
    "|".join(re.escape(p.pattern) for p in PrivateKeyDetector().denylist) + r"|BEGIN ENCRYPTED PRIVATE KEY"
)
PRIVATE_KEY_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|---- END SSH2 ENCRYPTED PRIVATE KEY ----")

# Assignments: detect-secrets' KeywordDetector forms, with the group that holds the value.
_KEYWORD_FORMS = (
    (keyword.FOLLOWED_BY_COLON_REGEX, 4),  # password: value, "api_key": "value"
    (keyword.FOLLOWED_BY_EQUAL_SIGNS_REGEX, 5),  # SECRET_KEY=value, secret = 'value'
    (keyword.FOLLOWED_BY_COLON_EQUAL_SIGNS_REGEX, 4),  # password := "value"
    (keyword.FOLLOWED_BY_ARROW_FUNCTION_SIGN_QUOTES_REQUIRED_REGEX, 4),  # 'password' => 'value'
    (keyword.FOLLOWED_BY_QUOTES_AND_SEMICOLON_REGEX, 3),  # private_key "value";
)
# Names detect-secrets' keyword list lacks: tokens, access keys, credentials (GITHUB_TOKEN=...,
# aws_session_token = ..., "x-api-key": "...").
# Where a name that can hold a secret starts, in lowercased text (a lookahead, so names inside names
# are found too: "secret" in "client_secret").
_NAMES = (*keyword.DENYLIST, "token", r"access[_-]?key", r"api[_-]?key", "credential", r"client[_-]?secret", "auth")
_NAME_AT = re.compile("|".join(_NAMES))
# Every name holds one of these, at most _LONGEST_PREFIX characters from its start ("database_pass").
_ANCHORS = ("key", "pass", "pwd", "secret", "contrase", "token", "credential", "auth")
_LONGEST_PREFIX = 9
_NAME_STARTS_ANY_CASE = re.compile("(?=" + "|".join(_NAMES) + ")", re.IGNORECASE)
_NAMED_VALUE = re.compile(
    r"(?:token|access[_-]?key|api[_-]?key|credentials?|client[_-]?secret|auth)\w*['\"\]]{0,2}\s*(?::=|=>|[:=])\s*"
    r"(['\"`]?)([^\s'\"`,;]{8,512})\1",
    re.IGNORECASE,
)
_BEARER = re.compile(r"\b(?:Bearer|token)\s+([A-Za-z0-9._~+/-]{20,}=*)", re.IGNORECASE)
# "my password is hunter2", "pwd: P@ss-1234": a value with a digit or a symbol, so "password is
# required" or "password: at least 12 characters" are not one.
_STATED_PASSWORD = re.compile(
    r"p(?<!\wp)(?:assword|asswd|assphrase|asscode|wd|in code)\s*(?:is|was|=|:)\s*[\"'`]?"
    r"((?=[^\s\"'`]*[A-Za-z])(?=[^\s\"'`]*[\d!@#$%^&*_+=?~])[^\s\"'`]{6,64})",
    re.IGNORECASE,
)
# One Hyperscan pass says which of these can match a text (gateway.screening.spans.Prefilter).
_PREFILTER = Prefilter([p for _, p in _TOKEN_PATTERNS] + [p for _, p in _VALUE_PATTERNS] + [_STATED_PASSWORD])
_VALUES_FROM = len(_TOKEN_PATTERNS)  # the prefilter's index of the first of _VALUE_PATTERNS
_STATED_PASSWORD_INDEX = len(_TOKEN_PATTERNS) + len(_VALUE_PATTERNS)
_CALL = re.compile(r"[A-Za-z_][\w.]*\(")  # get_password(), os.getenv("KEY"): a reference, not a value
_SYMBOLS = frozenset("!@#$%^&*+=?~/|")
_PLACEHOLDER = re.compile(
    r"^(?:x+|\*+|\.+|-+|#+|changeme|change_me|example|redacted|null|none|true|false|undefined|"
    r"(?:your|my)[_-].*|.*(?:_here|placeholder).*|\$.*|%.*%|<.*>|\{.*\}|\[.*\]|os\.\w+.*|process\.env.*|env\(.*)$"
    # names rather than values: tls-cert, db-creds-2, app_settings
    r"|^(?-i:[a-z]+(?:[-_.][a-z]+)+[-_.]?\d{0,3})$",
    re.IGNORECASE,
)
# Characters a token is made of: a span is widened over them, forward (padding `=` included) and
# backward (no `=`, or `key=value` would take the name with it).
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+/")
_TOKEN_CHARS_FORWARD = _TOKEN_CHARS | {"="}


def credential_like(value: str) -> bool:
    """A value named a secret that looks like one: no spaces, a letter and a digit or a symbol,
    not a placeholder, a template or a reference to somewhere else."""
    if not 6 <= len(value) <= 512 or any(c.isspace() for c in value):
        return False
    if _PLACEHOLDER.match(value) or is_templated_secret(value) or _CALL.match(value):
        return False
    has_letter = any(c.isalpha() for c in value)
    has_other = any(c.isdigit() or c in _SYMBOLS for c in value)
    return has_letter and has_other


def _whole_token(text: str, start: int, end: int, *, dots: bool = False, trim: bool = True) -> tuple[int, int]:
    """The span widened to the whole token it lies in, and (`trim`) stripped of the separators some
    patterns include (a leading space or quote, a trailing quote)."""
    chars = _TOKEN_CHARS | {"."} if dots else _TOKEN_CHARS
    forward = chars | {"="}
    while trim and start < end and text[start] not in forward:
        start += 1
    while trim and end > start and text[end - 1] not in forward:
        end -= 1
    while start > 0 and text[start - 1] in chars:
        start -= 1
    while end < len(text) and text[end] in forward:
        end += 1
    if dots:
        while end > start and text[end - 1] == ".":
            end -= 1  # the full stop after a JWT
    return start, end


def _value_span(text: str, start: int, end: int) -> tuple[int, int] | None:
    """A named value, cut at the first space (KeywordDetector's value runs to the end of the line)
    and trimmed of closing punctuation; None when it does not look like a credential."""
    limit = min(end, start + LONGEST_VALUE)
    space = _SPACE.search(text, start, limit)
    if space is not None:
        end = space.start()
    elif end > limit:
        return None  # no space for LONGEST_VALUE characters: far longer than a credential
    while end > start and text[end - 1] in ".,;:)]}>'\"`":
        end -= 1
    return (start, end) if credential_like(text[start:end]) else None


# What a named value is read up to: a credential is at most 512 characters (credential_like), and
# the closing punctuation after it is trimmed; each try reads a bounded stretch of text, so a text
# of thousands of names costs its length, not its length squared.
LONGEST_VALUE = 1024


KEYWORD_REACH = 4096  # as streaming.MAX_TOKEN


_SPACE = re.compile(r"\s")
_VALUE_STOP = re.compile(r"[\s'\"]")  # a value (`[^\v'"]*`) ends at a quote; it is cut at a space


def _name_starts(text: str, lowered: str) -> list[int]:
    """Where secret-sounding names start. KeywordDetector's patterns begin with an alternation of 18
    names that Python's engine tries at every position (milliseconds on a long prompt); they are
    matched only where a name starts: a few positions before each of a handful of substrings."""
    if len(lowered) != len(text):  # lowercasing moved the positions (İ is two characters lowercased)
        return [m.start() for m in _NAME_STARTS_ANY_CASE.finditer(text)]
    starts = set()
    for anchor in _ANCHORS:
        at = lowered.find(anchor)
        while at >= 0:
            for start in range(max(0, at - _LONGEST_PREFIX), at + 1):
                if start not in starts and _NAME_AT.match(lowered, start):
                    starts.add(start)
            at = lowered.find(anchor, at + 1)
    return sorted(starts)


def find(text: str) -> list[Span]:
    """Every secret in `text`, each span the whole value (overlaps are settled by the caller)."""
    spans = []
    candidates = _PREFILTER.scan(text)
    # The patterns the prefilter lets through, in their order (most texts: a few of the 61).
    indexes = sorted(candidates.candidates)
    for index in indexes:
        if index >= _VALUES_FROM:
            break
        literals, pattern = _TOKEN_PATTERNS[index]
        if literals and not any(literal in text for literal in literals):
            continue
        for match in candidates.finditer(index, pattern, text):
            spans.append(Span(SECRET, *_whole_token(text, *match.span())))
    for index in indexes:
        if not _VALUES_FROM <= index < _STATED_PASSWORD_INDEX:
            continue
        literals, pattern = _VALUE_PATTERNS[index - _VALUES_FROM]
        if literals and not any(literal in text for literal in literals):
            continue
        for match in candidates.finditer(index, pattern, text):
            if match.group(1):
                spans.append(Span(SECRET, *_whole_token(text, *match.span(1), trim=False)))
    if "eyJ" in text:
        for match in _JWT_PATTERN.finditer(text):
            if match.group().count(".") >= 1 and _JWT.is_formally_valid(match.group().rstrip(".")):
                spans.append(Span(SECRET, *_whole_token(text, *match.span(), dots=True)))
    if "PRIVATE KEY" in text or "PuTTY" in text:
        for start, end in _private_keys(text):
            spans.append(Span(SECRET, start, end.end() if end else len(text)))
    lowered = text.lower()
    if "=" in text or ":" in text:
        for start in _name_starts(text, lowered):
            # detect-secrets reads a file line by line, and its value (`[^\v'"]*`, where Python's \v
            # is one character, not a line break) runs on to the first quote: over the whole text,
            # a line of thousands of `api_key=...` made each try read to its end (100,000
            # characters: 1.4 s of CPU; 4 MB: hours). A try reads the rest of its line, at most
            # KEYWORD_REACH characters; a value the reach cuts runs on to its first space, as before.
            line_end = text.find("\n", start)
            reach = min(start + KEYWORD_REACH, len(text) if line_end < 0 else line_end)
            for pattern, group in _KEYWORD_FORMS:
                match = pattern.match(text, start, reach)
                if match is not None:
                    value_start, value_end = match.span(group)
                    if value_end == reach and reach < len(text):
                        # Where the value would have stopped without the reach: a space, a quote or
                        # the end of the text, or past LONGEST_VALUE (then too long to be one).
                        stop = _VALUE_STOP.search(text, reach, value_start + LONGEST_VALUE + 1)
                        value_end = stop.start() if stop else min(len(text), value_start + LONGEST_VALUE + 1)
                    value = _value_span(text, value_start, value_end)
                    if value is not None:
                        spans.append(Span(SECRET, *value))
            match = _NAMED_VALUE.match(text, start)
            if match is not None:
                value = _value_span(text, *match.span(2))
                if value is not None:
                    spans.append(Span(SECRET, *value))
    for word in ("bearer", "token"):
        at = lowered.find(word) if len(lowered) == len(text) else -1
        while at >= 0:
            match = _BEARER.match(text, at)
            if match is not None and credential_like(match.group(1)):
                spans.append(Span(SECRET, *_whole_token(text, *match.span(1))))
            at = lowered.find(word, at + len(word))
    for match in _STATED_PASSWORD.finditer(text) if _STATED_PASSWORD_INDEX in candidates else ():
        if credential_like(match.group(1)):
            spans.append(Span(SECRET, *match.span(1)))
    return spans


def _private_keys(text: str) -> Iterator[tuple[int, re.Match | None]]:
    """Each private key's start (the dashes before its BEGIN, when they touch it) and the first END
    line after its BEGIN (None: none follows). The END found for one BEGIN serves the BEGIN lines
    before it, and none after one means none after the next (thousands of BEGIN lines without an
    END searched the rest of the text each, and the text before each for dashes)."""
    end, ends_left = None, True
    for match in _PRIVATE_KEY_BEGIN.finditer(text):
        begin = match.start()
        start = begin - 5 if begin >= 5 and text.startswith("-----", begin - 5) else begin
        if ends_left and (end is None or end.start() < match.end()):
            end = PRIVATE_KEY_END.search(text, match.end())
            ends_left = end is not None
        yield start, end


def unterminated_private_key(text: str) -> int | None:
    """Where a private key that has begun but not ended starts in `text` (a stream holds it back
    from there until its END line), or None."""
    if "PRIVATE KEY" not in text and "PuTTY" not in text and "BEGIN" not in text[-40:]:
        return None
    start = next((begin for begin, end in _private_keys(text) if end is None), None)
    if start is None:
        # A BEGIN line still arriving: "-----BEGIN RSA PRIV" could be the start of a key.
        tail = text.rfind("-----BEGIN")
        if tail >= 0 and "\n" not in text[tail:] and len(text) - tail < 60:
            start = tail
    return start
