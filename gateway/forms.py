"""multipart/form-data bodies read into their parts (the image edit and variation forms, and the mock
provider's side of them).

The standard library's MIME parser, not Django's: Django's decides a part is a file by its
`filename` and decodes every other part as text, so an image sent without a filename (as some
clients and schemathesis send them) would arrive mangled. Here every part keeps its bytes and its
filename, if any; what a part is for is the caller's decision. The parser is lenient, so what it
notes as a defect (no boundary, no closing boundary, a part without headers) is refused here.
"""

from __future__ import annotations

import email
import email.policy
from dataclasses import dataclass
from email.message import EmailMessage, Message

MAX_PARTS = 64  # an edit's 16 images, a mask and its dozen fields, with room to spare


class FormError(ValueError):
    """The body is no multipart form this reads; the text says why."""


@dataclass(frozen=True)
class Part:
    name: str
    content: bytes
    filename: str | None  # None: sent as a plain field
    media_type: str  # as the part's Content-Type says (text/plain when it says nothing)


def parts(content_type: str, raw: bytes) -> list[Part]:
    """The form's parts, in order. Raises FormError."""
    if not raw.strip():
        raise FormError("the body is empty")
    try:
        header = content_type.encode("latin-1")
    except UnicodeEncodeError:
        raise FormError("the content type is not Latin-1") from None
    boundary = _boundary(content_type)
    # Counted before parsing: the parser spends about 55 µs a part, so a 4 MiB body of tiny parts
    # would cost seconds of CPU before its part count could be refused.
    if raw.count(b"--" + boundary) > MAX_PARTS + 1:
        raise FormError(f"more than {MAX_PARTS} parts")
    message = email.message_from_bytes(b"Content-Type: " + header + b"\r\n\r\n" + raw, policy=email.policy.HTTP)
    if not isinstance(message, EmailMessage) or not message.is_multipart():
        raise FormError("no parts: a multipart/form-data content type with a boundary is needed")
    if message.defects:
        raise FormError(_defect(message.defects[0]))
    found = []
    for part in message.iter_parts():
        if len(found) == MAX_PARTS:
            raise FormError(f"more than {MAX_PARTS} parts")
        if part.defects:
            raise FormError(_defect(part.defects[0]))
        name = part.get_param("name", header="content-disposition")
        if part.get_content_disposition() != "form-data" or not isinstance(name, str) or not name:
            raise FormError("a part without `Content-Disposition: form-data; name=...`")
        content = part.get_payload(decode=True)
        if not isinstance(content, bytes):
            raise FormError(f"the part '{name}' holds parts of its own")
        found.append(Part(name=name, content=content, filename=part.get_filename(), media_type=part.get_content_type()))
    if not found:
        raise FormError("no parts")
    return found


def _boundary(content_type: str) -> bytes:
    header = Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str) or not boundary or len(boundary) > 200:
        raise FormError("no parts: a multipart/form-data content type with a boundary is needed")
    return boundary.encode("latin-1")


def _defect(defect: Exception) -> str:
    return (defect.__doc__ or type(defect).__name__).strip().splitlines()[0].rstrip(".").lower()
