"""Secrets in their real forms (gateway.screening.credentials): each provider's keys and tokens,
quoted and unquoted, as config files, environment variables and code write them, masked whole; and
the clean look-alikes (hashes, UUIDs, git remotes, placeholders, prose about passwords) left alone."""

from __future__ import annotations

import pytest

from gateway.screening import credentials
from gateway.screening.engine import mask
from gateway.screening.personal_data import KINDS, find

AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
GITHUB_PAT = "github_pat_11ABCDEFG0123456789abc_" + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456"


def secrets_in(text: str) -> list[str]:
    return [text[s.start : s.end] for s in find(text, ("secret",))]


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        # Issue 25: the credentials-file form (unquoted) and the fine-grained GitHub token.
        (f"[default]\naws_secret_access_key = {AWS_SECRET}\n", AWS_SECRET),
        (f"aws_secret_access_key={AWS_SECRET}", AWS_SECRET),
        (f"export AWS_SECRET_ACCESS_KEY={AWS_SECRET}", AWS_SECRET),
        (f'AWS_SECRET_ACCESS_KEY="{AWS_SECRET}"', AWS_SECRET),
        (f'{{"SecretAccessKey": "{AWS_SECRET}"}}', AWS_SECRET),
        (f"secret_access_key: {AWS_SECRET}", AWS_SECRET),
        (f"token {GITHUB_PAT} fails", GITHUB_PAT),
        (f"GITHUB_TOKEN={GITHUB_PAT}", GITHUB_PAT),
        # Issue 25: the mask covered the prefix only.
        ("use ghp_8fK2mQ9xLr4Tz7Wv1Bn6Yc3Ud5Ae0Gh2Jk4M now", "ghp_8fK2mQ9xLr4Tz7Wv1Bn6Yc3Ud5Ae0Gh2Jk4M"),
        ("gitlab glpat-Xq3T9vRb7LmN2pWs4KdY ok", "glpat-Xq3T9vRb7LmN2pWs4KdY"),
        (f"jwt {JWT}.", JWT),
        # Other providers, in environment and config forms.
        (
            'OPENAI_API_KEY="sk-proj-Tq8vN2kL5mZx7Rb4Wc9Yd1Hf6Js3Pg0Ae5Ui2Oo8"',
            "sk-proj-Tq8vN2kL5mZx7Rb4Wc9Yd1Hf6Js3Pg0Ae5Ui2Oo8",
        ),
        (
            "ANTHROPIC_API_KEY=sk-ant-api03-Zq7Xk2Lm9Vb4Nc8Hs1Jd6Fw3Pa0Ye5Ui2Oo7Tr4Ws9",
            "sk-ant-api03-Zq7Xk2Lm9Vb4Nc8Hs1Jd6Fw3Pa0Ye5Ui2Oo7Tr4Ws9",
        ),
        ("client_secret: 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", "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"),
        (
            "Authorization: Bearer ya29.a0AfH6SMBx3kLm9Qz7Vb2Nc8Hs1Jd6Fw3Pa0Ye5",
            "ya29.a0AfH6SMBx3kLm9Qz7Vb2Nc8Hs1Jd6Fw3Pa0Ye5",
        ),
        ("HF_TOKEN=hf_kXqLmZvBnCwYdTrEsFgHjKuIoPaQzWx12345", "hf_kXqLmZvBnCwYdTrEsFgHjKuIoPaQzWx12345"),
        (
            "//registry.npmjs.org/:_authToken=npm_Q9xLm2Kv7Bn4Zc8Hs1Jd6Fw3Pa0Ye5Ui2Oo7",
            "npm_Q9xLm2Kv7Bn4Zc8Hs1Jd6Fw3Pa0Ye5Ui2Oo7",
        ),
        ("STRIPE_WEBHOOK_SECRET=whsec_9aZ3kLm2Qv7Bn4Zc8Hs1Jd6Fw3Pa0Y", "whsec_9aZ3kLm2Qv7Bn4Zc8Hs1Jd6Fw3Pa0Y"),
        (
            "azure:\n  client_secret: 'Xk48Q~abcDEFghiJKLmnoPQRstuVWXyz0123456'",
            "Xk48Q~abcDEFghiJKLmnoPQRstuVWXyz0123456",
        ),
        ("VAULT_TOKEN=hvs.CAESIJ7k2Lm9Qz7Vb2Nc8Hs1Jd6Fw3Pa0Ye5", "hvs.CAESIJ7k2Lm9Qz7Vb2Nc8Hs1Jd6Fw3Pa0Ye5"),
        (
            "GROQ_API_KEY=gsk_" + "a1B2c3D4e5F6g7H8i9J0" * 2 + "kLmNoPqRsTuV",
            "gsk_" + "a1B2c3D4e5F6g7H8i9J0" * 2 + "kLmNoPqRsTuV",
        ),
        (
            "aws_session_token = IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQ",
            "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQ",
        ),
        ('password = "Tr0ub4dor&3"', "Tr0ub4dor&3"),
        ("DB_PASSWORD=hunter2!", "hunter2!"),
        ("postgres://admin:Xk9#mP2vL@db.prod.internal:5432/app", "Xk9#mP2vL"),
        ("curl -u deploy:Gh7!kq92Lx https://ci.example.com", "Gh7!kq92Lx"),
    ],
)
def test_real_forms_are_found_and_masked_whole(text, secret):
    assert secret in secrets_in(text)
    masked = mask(text, find(text, KINDS))[0]
    assert secret not in masked and secret[4:12] not in masked


@pytest.mark.parametrize(
    "text",
    [
        "commit 3f786850e387550fdab836ed7e6dc881de23001b fixed it",
        "sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "request id 123e4567-e89b-12d3-a456-426614174000 failed",
        "git remote add origin git@github.com:acme/secret-project.git",
        "ISBN 978-3-16-148410-0",
        "password: at least 12 characters, one digit",
        "The secret to good bread is time.",
        "password is required",
        "api_key: ${OPENAI_API_KEY}",
        'api_key = os.environ["OPENAI_API_KEY"]',
        "API_KEY=<your-api-key>",
        "token: your_token_here",
        "secretName: tls-cert",
        "password = get_password()",
        "Reset your password at https://example.com/reset",
        "Use a token bucket: tokens = min(capacity, tokens + rate)",
    ],
)
def test_clean_look_alikes_are_left_alone(text):
    assert secrets_in(text) == []


def test_a_stream_holds_an_unfinished_private_key_from_its_begin_line():
    assert credentials.unterminated_private_key("ok\n-----BEGIN RSA PRIVATE KEY-----\nMIIE") == 3
    assert (
        credentials.unterminated_private_key("-----BEGIN RSA PRIVATE KEY-----\nMII\n-----END RSA PRIVATE KEY-----")
        is None
    )
    assert credentials.unterminated_private_key("nothing here") is None


def test_a_line_of_thousands_of_assignments_finds_each_value():
    """A keyword form's try reads the rest of its line, at most KEYWORD_REACH characters (over the
    whole text, a line of thousands of `api_key=...` made each try read to its end: quadratic). Each
    value is still found, and masked whole."""
    values = [f"{n:04d}f3a9c1e7b2d8" * 2 for n in range(2000)]
    text = " ".join(f"api_key={value}" for value in values)
    assert secrets_in(text) == values


def test_a_value_the_reach_cuts_is_read_to_its_first_space():
    """A value that begins just before KEYWORD_REACH (a long name before it) is read on to its first
    space, as over the whole text: found and masked whole."""
    value = "Zx9q7Wv" * 8
    name = "db_password_" + "x" * (credentials.KEYWORD_REACH - 30)  # a keyword form's name alone
    text = f"{name}={value} and more words"
    assert text.index(value) < credentials.KEYWORD_REACH < text.index(value) + len(value)
    assert secrets_in(text) == [value]
    assert mask(text, find(text, KINDS))[0] == f"{name}=[SECRET] and more words"


def test_a_run_of_names_without_spaces_is_read_a_bounded_stretch_at_a_time():
    """`secret=secret=...` (no space, no quote): each try reads at most LONGEST_VALUE characters of
    value (it read to the end of the text, each). The finding is the one the whole-text reading gave."""
    text = "secret=" * 500
    assert [(s.start, s.end) for s in find(text, ("secret",))] == [(2989, 3500)]
    assert secrets_in(f"db_pass='ab1 {'q' * 3000}'") == []  # a quoted value is cut at its first space


_BEGIN, _END = "-----BEGIN RSA PRIVATE KEY-----\n", "-----END RSA PRIVATE KEY-----\n"
# BEGIN lines with their dashes, more dashes or none; END lines; key bodies; prose.
_KEY_LINES = [
    _BEGIN,
    _END,
    "MIIEpAIBAAKCAQEA0Z3VS5JJcds3xfn\n",
    "plain words\n",
    "BEGIN RSA PRIVATE KEY ",
    "--" + _BEGIN,
]


def _start_as_searched(text: str, begin: int) -> int:
    """A private key's start as the per-BEGIN search found it: the last dashes within 5 before."""
    dashes = text.rfind("-----", 0, begin)
    return dashes if dashes >= 0 and begin - dashes <= 5 else begin


@pytest.mark.parametrize("seed", range(5))
def test_every_begin_line_is_masked_to_the_first_end_line_after_it(seed):
    """A private key runs from its BEGIN line to the first END line after it (the text's end if
    none); the END found for one BEGIN serves the next ones before it, so thousands of BEGIN lines
    cost one search, not one each to the end of the text."""
    import random

    rng = random.Random(seed)
    text = "".join(rng.choice([_BEGIN, *_KEY_LINES]) for _ in range(60))
    expected = []
    for match in credentials._PRIVATE_KEY_BEGIN.finditer(text):
        found = credentials.PRIVATE_KEY_END.search(text, match.end())
        expected.append((_start_as_searched(text, match.start()), found.end() if found else len(text)))
    keys = [(s.start, s.end) for s in credentials.find(text) if text[s.start : s.end].lstrip("-").startswith("BEGIN")]
    assert keys == expected


@pytest.mark.parametrize("seed", range(5))
def test_a_stream_holds_back_from_the_first_begin_line_without_an_end(seed):
    import random

    rng = random.Random(seed)
    text = "".join(rng.choice(_KEY_LINES) for _ in range(40))
    expected = next(
        (
            _start_as_searched(text, match.start())
            for match in credentials._PRIVATE_KEY_BEGIN.finditer(text)
            if credentials.PRIVATE_KEY_END.search(text, match.end()) is None
        ),
        None,
    )
    assert credentials.unterminated_private_key(text) == expected
