"""A document's text and its chunks.

Text: a PDF's pages through pypdf; HTML's visible text through the standard library's parser
(scripts, styles and the head left out; block elements end paragraphs); anything else must be UTF-8
text (plain or Markdown). Chunks follow the document's structure: it is cut into blocks at headings
(Markdown `#` lines, HTML headings) and blank lines, and consecutive blocks are packed into chunks of
at most CHUNK_CHARS characters; each chunk after the first starts with the last OVERLAP_CHARS or so
of the one before (whole words), so a passage cut at a boundary is still found whole in one of them.
A block longer than a chunk is cut at sentence ends, else at spaces. Chunks whose text is the same as
an earlier one's (case, spacing and punctuation aside) are dropped.
"""

from __future__ import annotations

import io
import re
from html.parser import HTMLParser

CHUNK_CHARS = 1_200  # about 300 tokens of English
OVERLAP_CHARS = 200


class DocumentError(ValueError):
    """The file is no document this reads; the text says why (shown as the file's last_error)."""


def text_of(filename: str, content: bytes) -> str:
    if content.startswith(b"%PDF-"):
        return _pdf_text(content)
    head = content[:512].lstrip().lower()
    if filename.lower().endswith((".html", ".htm")) or head.startswith((b"<!doctype html", b"<html")):
        return _html_text(_decoded(content))
    return _decoded(content)


def _decoded(content: bytes) -> str:
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DocumentError("The file is not UTF-8 text, HTML or PDF.") from None
    if "\x00" in text:
        raise DocumentError("The file holds NUL characters: it is not a text document.")
    return text


def _pdf_text(content: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(content))
        return "\n\n".join(page.extract_text() or "" for page in reader.pages)
    except (PyPdfError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise DocumentError(f"The PDF could not be read: {type(exc).__name__}.") from None


_BLOCKS = frozenset(
    {"p", "div", "section", "article", "li", "tr", "br", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "table"}
)
_HIDDEN = frozenset({"script", "style", "head", "template", "noscript"})


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in _HIDDEN:
            self.hidden += 1
        elif tag in _BLOCKS:
            self.parts.append("\n\n" + ("# " if tag in ("h1", "h2", "h3", "h4", "h5", "h6") else ""))

    def handle_endtag(self, tag: str) -> None:
        if tag in _HIDDEN and self.hidden:
            self.hidden -= 1
        elif tag in _BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.parts.append(data)


def _html_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    parser.close()
    return "".join(parser.parts)


_HEADING = re.compile(r"^\s{0,3}#{1,6}\s")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_NORMAL = re.compile(r"[\W_]+")


def blocks(text: str) -> list[str]:
    """Paragraphs, each heading starting a new one; whitespace inside a block made single spaces."""
    found: list[str] = []
    current: list[str] = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if not line.strip() or _HEADING.match(line):
            if current:
                found.append(" ".join(current))
                current = []
            if not line.strip():
                continue
        current.append(" ".join(line.split()))
    if current:
        found.append(" ".join(current))
    return [block for block in found if block]


def _pieces(block: str) -> list[str]:
    """A block cut to fit a chunk: at sentence ends, else at spaces, else anywhere."""
    if len(block) <= CHUNK_CHARS:
        return [block]
    pieces: list[str] = []
    for sentence in _SENTENCE_END.split(block):
        while len(sentence) > CHUNK_CHARS:
            cut = sentence.rfind(" ", 0, CHUNK_CHARS)
            cut = cut if cut > 0 else CHUNK_CHARS
            pieces.append(sentence[:cut])
            sentence = sentence[cut:].lstrip()
        if pieces and len(pieces[-1]) + 1 + len(sentence) <= CHUNK_CHARS:
            pieces[-1] += " " + sentence
        elif sentence:
            pieces.append(sentence)
    return pieces


def _tail(text: str) -> str:
    """About the last OVERLAP_CHARS of a chunk, from a word start."""
    if len(text) <= OVERLAP_CHARS:
        return text
    tail = text[-OVERLAP_CHARS:]
    space = tail.find(" ")
    return tail[space + 1 :] if 0 <= space < len(tail) - 1 else tail


def chunks(text: str) -> list[str]:
    """The document's chunks, in order, near duplicates dropped."""
    packed: list[str] = []
    current = ""
    for block in blocks(text):
        for piece in _pieces(block):
            if current and len(current) + 2 + len(piece) > CHUNK_CHARS:
                packed.append(current)
                overlap = _tail(current)
                current = overlap + "\n\n" + piece if len(overlap) + 2 + len(piece) <= CHUNK_CHARS else piece
            else:
                current = current + "\n\n" + piece if current else piece
    if current:
        packed.append(current)
    seen: set[str] = set()
    kept = []
    for chunk in packed:
        key = _NORMAL.sub(" ", chunk.lower()).strip()
        if key and key not in seen:
            seen.add(key)
            kept.append(chunk)
    return kept
