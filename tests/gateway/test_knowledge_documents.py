"""A document's text and chunks (gateway/knowledge/documents.py), without servers."""

from __future__ import annotations

import random
import re

import pytest

from gateway.knowledge.documents import CHUNK_CHARS, OVERLAP_CHARS, DocumentError, _tail, blocks, chunks, text_of


def sentences(rng: random.Random, count: int) -> list[str]:
    words = "refund parcel card warehouse office kettle warranty garage ticket invoice customer order".split()
    return [
        f"Sentence {n} says " + " ".join(rng.choice(words) for _ in range(rng.randint(4, 30))) + "."
        for n in range(count)
    ]


def test_chunks_follow_headings_fit_their_size_overlap_and_lose_no_sentence():
    rng = random.Random(24)
    said = sentences(rng, 120)
    text, at = "", 0
    for section in range(8):
        text += f"# Section {section}\n\n"
        for _ in range(3):
            take = rng.randint(2, 7)
            text += " ".join(said[at : at + take]) + "\n\n"
            at += take
    text += " ".join(said[at:]) + "\n"  # one long paragraph: cut at sentence ends
    found = chunks(text)
    assert len(found) > 5
    assert all(len(chunk) <= CHUNK_CHARS for chunk in found)
    joined = "\n".join(found)
    assert all(sentence in joined for sentence in said)  # nothing lost, none cut mid-sentence
    # Each chunk after the first begins with the last words of the one before (the overlap), unless
    # those and its first piece would not fit in one chunk.
    overlapped = 0
    for before, after in zip(found, found[1:], strict=False):
        tail = _tail(before)
        assert len(tail) <= OVERLAP_CHARS and before.endswith(tail)
        if after.startswith(tail + "\n\n"):
            overlapped += 1
        else:
            assert len(tail) + 2 + len(after.split("\n\n", 1)[0]) > CHUNK_CHARS
    assert overlapped >= len(found) // 3


def test_headings_start_blocks_and_duplicates_are_dropped():
    # A heading starts a block and stays with the lines under it.
    assert blocks("intro\n# A\ntext one\ntext two\n\n## B\nmore") == ["intro", "# A text one text two", "## B more"]
    # A page footer repeated, a block a chunk long each time: one chunk of it is kept.
    block = " ".join(sentences(random.Random(5), 60))[: CHUNK_CHARS - 100]
    assert chunks(f"{block}\n\n{block.upper()}\n\n{block}") == [block]
    assert chunks("") == [] and chunks(" \n\n ") == []


def test_a_word_longer_than_a_chunk_is_cut_anyway():
    rng = random.Random(3)
    word = "".join(rng.choice("abcdefghij") for _ in range(3 * CHUNK_CHARS))
    assert chunks(word) == [word[:CHUNK_CHARS], word[CHUNK_CHARS : 2 * CHUNK_CHARS], word[2 * CHUNK_CHARS :]]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("a.bin", b"\xff\xfe\xfa", "not UTF-8 text, HTML or PDF"),
        ("a.txt", b"text\x00with NUL", "NUL"),
        ("a.pdf", b"%PDF-1.7 garbage", "The PDF could not be read"),
    ],
)
def test_what_is_no_document_is_refused_with_the_reason(name, content, message):
    with pytest.raises(DocumentError, match=re.escape(message)):
        text_of(name, content)


def test_html_gives_its_visible_text_with_headings():
    html = (
        b"<html><head><title>T</title><script>var x=1</script></head>"
        b"<body><h2>Hours</h2><p>Open &amp; ready</p></body></html>"
    )
    text = text_of("page.html", html)
    assert "var x" not in text and "T" not in text.split()
    assert blocks(text) == ["# Hours", "Open & ready"]
