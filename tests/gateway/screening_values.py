"""Hypothesis strategies for the redaction property tests: secret and personal values of each kind
in their real forms, and the contexts they turn up in (prose, code, config files, JSON, URLs)."""

from __future__ import annotations

import base64
import json
import string

from hypothesis import strategies as st
from stdnum import luhn

LEAK_LENGTH = 6  # no piece of a value this long may survive redaction
PLACEHOLDERS = "[SECRET] [EMAIL] [PAYMENT_CARD] [PHONE] [IBAN] [NATIONAL_ID] [IP_ADDRESS] SECRET EMAIL PAYMENT_CARD"

ALNUM = string.ascii_letters + string.digits
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"


def chars(alphabet: str, size: int, max_size: int | None = None) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, min_size=size, max_size=size if max_size is None else max_size)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@st.composite
def jwts(draw) -> str:
    header = {"alg": draw(st.sampled_from(["HS256", "RS256", "ES256"])), "typ": "JWT"}
    claims = {
        "sub": draw(chars(ALNUM, 4, 24)),
        "iat": draw(st.integers(1_500_000_000, 1_900_000_000)),
        "name": draw(st.text(alphabet=string.ascii_letters + " ", min_size=3, max_size=30)),
    }
    signature = draw(st.binary(min_size=32, max_size=256))
    return (
        ".".join(_b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims))
        + "."
        + _b64url(signature)
    )


@st.composite
def private_keys(draw) -> str:
    kind = draw(st.sampled_from(["RSA ", "EC ", "OPENSSH ", "", "DSA ", "ENCRYPTED "]))
    body = draw(st.binary(min_size=120, max_size=1800))
    encoded = base64.b64encode(body).decode()
    lines = [encoded[i : i + 64] for i in range(0, len(encoded), 64)]
    return f"-----BEGIN {kind}PRIVATE KEY-----\n" + "\n".join(lines) + f"\n-----END {kind}PRIVATE KEY-----"


@st.composite
def cards(draw) -> str:
    prefix, length = draw(
        st.sampled_from([("4", 16), ("51", 16), ("55", 16), ("2221", 16), ("34", 15), ("37", 15), ("6011", 16)])
    )
    body = prefix + draw(chars(string.digits, length - len(prefix) - 1))
    number = body + luhn.calc_check_digit(body)
    separator = draw(st.sampled_from(["", " ", "-", "."]))
    if not separator:
        return number
    groups = (4, 6, 5) if length == 15 else (4, 4, 4, 4)
    parts, at = [], 0
    for size in groups:
        parts.append(number[at : at + size])
        at += size
    return separator.join(parts)


LOCAL_CHARS = string.ascii_lowercase + string.digits
UNICODE_LETTERS = "äöüßéèñøåçłšžığ"


@st.composite
def emails(draw) -> str:
    local = draw(chars(LOCAL_CHARS, 1, 10))
    local += draw(st.sampled_from(["", ".", "'", "+", "_", "-"]))
    local += draw(chars(LOCAL_CHARS + UNICODE_LETTERS, 1, 10))
    domain = draw(chars(string.ascii_lowercase + UNICODE_LETTERS, 2, 12))
    if draw(st.booleans()):
        domain += "-" + draw(chars(string.ascii_lowercase, 2, 8))
    tld = draw(st.sampled_from(["de", "com", "org", "fr", "es", "co.uk", "ch", "рф", "xn--p1ai", "museum"]))
    return f"{local}@{domain}.{tld}"


def _token(prefix: str, alphabet: str, size: int, max_size: int | None = None) -> st.SearchStrategy[str]:
    return chars(alphabet, size, max_size).map(lambda body: prefix + body)


@st.composite
def github_pats(draw) -> str:
    return "github_pat_" + draw(chars(ALNUM, 22)) + "_" + draw(chars(ALNUM, 59))


@st.composite
def aws_secrets(draw) -> tuple[str, str]:
    """(the secret access key, the line it is written in): credentials file, .env, JSON, YAML."""
    # Forty random base64 characters: in practice always letters of both cases and digits.
    value = draw(chars(B64, 40).filter(lambda v: not v.isalpha() and not v.isdigit() and v.lower() != v))
    form = draw(
        st.sampled_from(
            [
                "aws_secret_access_key = {v}",
                "aws_secret_access_key={v}",
                "AWS_SECRET_ACCESS_KEY={v}",
                'export AWS_SECRET_ACCESS_KEY="{v}"',
                '"SecretAccessKey": "{v}"',
                "secret_access_key: {v}",
            ]
        )
    )
    return value, form.format(v=value)


TOKENS = {
    "github": st.sampled_from(["ghp_", "gho_", "ghu_", "ghs_", "ghr_"]).flatmap(lambda p: _token(p, ALNUM, 36)),
    "github_pat": github_pats(),
    "gitlab": _token("glpat-", ALNUM + "_-", 20),
    "openai": _token("sk-proj-", ALNUM + "_-", 40, 120),
    "anthropic": _token("sk-ant-api03-", ALNUM + "_-", 80, 95),
    "google": _token("AIza", ALNUM + "_-", 35),
    "huggingface": _token("hf_", ALNUM, 34),
    "stripe": _token("sk_live_", ALNUM, 24, 99),
    "slack": st.tuples(chars(string.digits, 10, 13), chars(string.digits, 10, 13), chars(ALNUM, 24)).map(
        lambda t: f"xoxb-{t[0]}-{t[1]}-{t[2]}"
    ),
    "npm": _token("npm_", ALNUM, 36),
    "aws_key_id": _token("AKIA", string.ascii_uppercase + string.digits, 16),
    "jwt": jwts(),
    "private_key": private_keys(),
}
PERSONAL = {"email": emails(), "card": cards()}

# Where a value turns up: each context holds it once, as {v}.
CONTEXTS = st.sampled_from(
    [
        "{v}",
        "my key is {v}",
        "Here it is: {v}. Why does it fail?",
        'token = "{v}"',
        "token='{v}'",
        "KEY={v}\nOTHER=1",
        '{{"value": "{v}", "n": 1}}',
        "curl -H 'X-Key: {v}' https://api.example.com",
        "https://api.example.com/v1?key={v}&page=2",
        "```\n{v}\n```",
        "(see {v})",
        "<{v}>",
        "- {v}\n- next item",
        "Clé : {v} — merci !",
        "密钥是 {v} ，谢谢",
        "first line\n\n{v}\n\nlast line, thanks a lot for the help with this one",
    ]
)


def leaked(value: str, output: str, context: str) -> list[str]:
    """Pieces of `value` (LEAK_LENGTH long) found in `output` that the surrounding text or a
    placeholder does not explain."""
    explained = context + " " + PLACEHOLDERS
    pieces = {value[i : i + LEAK_LENGTH] for i in range(max(1, len(value) - LEAK_LENGTH + 1))}
    return sorted(p for p in pieces if p in output and p not in explained)
