"""Unit tests of the semantic-cache acceptance step: every rejection rule fires on a clear example
and says why, and paraphrases of each allowed style are accepted.

The similarity passed in is a stand-in for the embedding cosine (0.95 = a near neighbour), so these
tests exercise the verifier alone and need no model.
"""

from __future__ import annotations

import pytest

from gateway.cache.acceptance import DEFAULT_THRESHOLD, Verdict, normalize_prompt, verify

NEAR = 0.95


# --- exact tier ------------------------------------------------------------------------------


def test_normalize_collapses_whitespace_and_trims() -> None:
    assert normalize_prompt("  What is\tthe  capital\r\nof France?  ") == ("What is the capital of France?")


def test_normalize_keeps_case_and_code_blocks() -> None:
    prompt = "Fix   this:\n```python\ndef f():\n    return  1\n```"
    assert normalize_prompt(prompt) == "Fix this: ```python\ndef f():\n    return  1\n```"
    assert normalize_prompt("the Users table") != normalize_prompt("the users table")


def test_normalize_unicode_nfc() -> None:
    assert normalize_prompt("cafe\u0301") == normalize_prompt("caf\u00e9")


# --- rejections: each rule on a clear example --------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "reason"),
    [
        (
            "Give me 5 ideas for a birthday party.",
            "Give me 10 ideas for a birthday party.",
            "numbers differ",
        ),
        ("Who won the World Cup in 2018?", "Who won the World Cup in 2014?", "numbers differ"),
        (
            "What is the cost of 1,000 shares?",
            "What is the cost of 10,000 shares?",
            "numbers differ",
        ),
        (
            "Who was the first president of France?",
            "Who was the second president of France?",
            "numbers differ",
        ),
        ("Convert 2.5 GB to MB.", "Convert 2.5 MB to GB.", "units differ"),
        ("Convert 100 US dollars to euros.", "Convert 100 euros to US dollars.", "units differ"),
        (
            "What is 2 to the power of 10?",
            "What is 10 to the power of 2?",
            "numbers in a different order",
        ),
        ("Solve for x: 3x + 7 = 22", "Solve for x: 3x - 7 = 22", "pasted or quoted text differs"),
        ("Is 0.1 + 0.2 equal to 0.3?", "Is 0.1 - 0.2 equal to 0.3?", "operators differ"),
        ("Which fruits can dogs eat?", "Which fruits can dogs not eat?", "negation"),
        ("How do I make bread with yeast?", "How do I make bread without yeast?", "'without'"),
        (
            "How can I increase my credit limit?",
            "How can I decrease my credit limit?",
            "opposite words",
        ),
        (
            "What should I do before a job interview?",
            "What should I do after a job interview?",
            "opposite words",
        ),
        (
            "How do I reverse a list in Python?",
            "How do I reverse a list in JavaScript?",
            "languages differ",
        ),
        (
            "Translate 'good night' into Spanish.",
            "Translate 'good night' into Portuguese.",
            "languages differ",
        ),
        (
            "Write a Dockerfile for a Node app.",
            "Explain a Dockerfile for a Node app.",
            "task differs",
        ),
        (
            "Give me an example of a noble gas.",
            "Give me examples of noble gases.",
            "one vs several",
        ),
        (
            "When did the Berlin Wall fall?",
            "Why did the Berlin Wall fall?",
            "question type differs",
        ),
        (
            "How do I accept a pull request on GitHub?",
            "How do I create a pull request on GitHub?",
            "different actions",
        ),
        (
            "How many tablespoons are in a cup?",
            "How many teaspoons are in a cup?",
            "words without a counterpart",
        ),
        (
            "Which foods are safe for dogs?",
            "Which foods are safe for dogs with kidney disease?",
            "words without a counterpart",
        ),
        (
            "Write a Python script that renames .txt files in a folder to .md.",
            "Write a Python script that renames .md files in a folder to .txt.",
            "order swapped",
        ),
        (
            "Translate 'thank you' into German.",
            "Translate 'thank you' from German.",
            "direction differs",
        ),
        (
            "Can a landlord sue a tenant for unpaid rent?",
            "Can a tenant sue a landlord for unpaid rent?",
            "order swapped",
        ),
        (
            "¿Cuál es la capital de Francia?",
            "¿Cuál es la capital de Alemania?",
            "words without a counterpart",
        ),
        (
            "Summarize this: The launch moved to May.",
            "Summarize this: The launch moved to June.",
            "pasted or quoted text differs",
        ),
        (
            "What does `git reset --hard` do?",
            "What does `git reset --soft` do?",
            "pasted or quoted text differs",
        ),
    ],
)
def test_rejects_different_requests(a: str, b: str, reason: str) -> None:
    verdict = verify(a, b, NEAR)
    assert not verdict.accepted
    assert verdict.reason.startswith(reason), verdict.reason
    assert not verify(b, a, NEAR).accepted  # the rules are symmetric


def test_reason_names_the_difference() -> None:
    verdict = verify("Convert 5 km to miles.", "Convert 10 km to miles.", NEAR)
    assert verdict == Verdict(False, "numbers differ: {5} vs {10}")


def test_rejects_below_threshold() -> None:
    verdict = verify("How do I bake bread?", "How do I bake bread?", DEFAULT_THRESHOLD - 0.01)
    assert not verdict.accepted
    assert verdict.reason.startswith("cosine")


def test_threshold_is_a_parameter() -> None:
    a, b = "How do I bake bread?", "how do i bake bread"
    assert verify(a, b, 0.6, threshold=0.5).accepted
    assert not verify(a, b, 0.6, threshold=0.7).accepted


# --- acceptances: each paraphrase style ------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # register and short vs long form
        ("What is the capital of Australia?", "Which city is Australia's capital?"),
        (
            "How do I reset my router to factory settings?",
            "router factory settings reset - how do i do it?",
        ),
        (
            "What's the difference between a list and a tuple in Python?",
            "python list vs tuple difference",
        ),
        (
            "What is the difference between a list and a tuple?",
            "What is the difference between a tuple and a list?",
        ),
        # politeness and filler
        (
            "Hey, quick question: how do I clear the cache in Chrome?",
            "How do I clear the cache in Chrome?",
        ),
        (
            "Could you please tell me how to enable dark mode on Android? Thanks!",
            "How do I turn on dark mode on Android?",
        ),
        # typos
        ("How do I calcualte the median in Excel?", "How do I calculate the median in Excel?"),
        (
            "whats the diffrence between a virus and bacteria",
            "What is the difference between a virus and bacteria?",
        ),
        # clause order
        ("In Excel, how do I freeze the top row?", "How do I freeze the top row in Excel?"),
        (
            "If I deposit $500 a month at 4% interest, what will I have after 10 years?",
            "What will I have after 10 years if I deposit $500 a month at 4% interest?",
        ),
        # numbers, units and abbreviations written differently
        ("Convert 5 kilometers to miles.", "whats 5 km in miles"),
        ("What is fifteen percent of 240?", "15% of 240 = ?"),
        (
            "How much is $1,000 at 5% simple interest for 3 years?",
            "How much is 1000 dollars at 5 percent simple interest for three years?",
        ),
        ("How long does shipping to Canada take?", "How many days does shipping to Canada take?"),
        ("What is the least common multiple of 8 and 12?", "Find the LCM of 8 and 12."),
        ("How do I set up Wi-Fi on a printer?", "How do I setup wifi on a printer?"),
        # the same pasted text with a differently worded instruction
        (
            "Summarize this email in one sentence: The offsite moves to Friday because the venue flooded.",
            "Give me a one-sentence summary of the following: 'The offsite moves to Friday because the venue flooded.'",
        ),
        (
            "Translate 'where is the station?' into Japanese.",
            "How do you say 'Where is the station?' in Japanese?",
        ),
    ],
)
def test_accepts_paraphrases(a: str, b: str) -> None:
    verdict = verify(a, b, NEAR)
    assert verdict.accepted, verdict.reason
    assert verify(b, a, NEAR).accepted


def test_identical_after_normalization_is_accepted() -> None:
    assert verify("What is  DNS?", " What is DNS? ", NEAR) == Verdict(True, "same prompt")


def test_deterministic() -> None:
    a, b = "Convert 5 miles to km please.", "whats 5 km in miles"
    assert {verify(a, b, NEAR) for _ in range(5)} == {verify(a, b, NEAR)}
