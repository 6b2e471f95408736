"""What text and JSON Sentinel accepts into what it stores or keys on: one rule for every way in (the
API's bodies through gateway.bodies, the management API's parameters, the console's forms).

- Names and identifiers (models, aliases, tenants, keys, users, metadata, custom ids, file names, ...)
  hold no control character (Unicode category Cc: U+0000-U+001F and U+007F-U+009F). They end up in
  logs, headers, CSV exports and cache keys, where a line break or an escape forges a line or a field.
- Free text (messages, descriptions) may hold tabs and line breaks, never another control character,
  and never NUL: PostgreSQL's text and jsonb cannot store it, so one NUL fails the write it is in.
- JSON nests at most MAX_JSON_DEPTH levels, well inside what every serialiser on the way handles
  (orjson gives up past 255 levels, Python's json near its recursion limit).

Django's own validators cover NUL only (ProhibitNullCharactersValidator); nothing in the ecosystem
covers the rest, so this is written here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NoReturn

from django.core.exceptions import ValidationError
from django.utils.deconstruct import deconstructible

# Real requests nest far less: an OpenAI function schema ten object levels deep (the most OpenAI's
# structured outputs allow), each level an array of objects, sits 34 deep in a request body
# (tests/gateway/test_bodies.py measures it).
MAX_JSON_DEPTH = 64
MAX_JSON_INT_DIGITS = 100  # an integer in a console JSON field (limits, provider settings) holds far fewer

# Row ids are PostgreSQL bigints. An id read from a query string is ASCII digits up to this: Python's
# isdigit() also takes other scripts' digits and superscripts (int() reads the former, fails on the
# latter), int() refuses over 4,300 digits, and PostgreSQL refuses a number past bigint.
BIGINT_MAX = 2**63 - 1


def row_id(value: str | None) -> int | None:
    """`value` as a row id (1 to BIGINT_MAX, ASCII digits alone), else None."""
    if not value or len(value) > 19 or not (value.isascii() and value.isdigit()):
        return None
    number = int(value)
    return number if 1 <= number <= BIGINT_MAX else None


CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
CONTROL_BUT_LINE_BREAKS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # tab, LF and CR allowed


def control_character(value: str, *, multiline: bool = False) -> str | None:
    """The first control character in `value` as U+XXXX, or None. `multiline` allows tab, LF, CR."""
    found = (CONTROL_BUT_LINE_BREAKS if multiline else CONTROL).search(value)
    return None if found is None else f"U+{ord(found.group()):04X}"


@dataclass(frozen=True)
class Problem:
    """What is wrong with a JSON value, and where: `path` as OpenAI names fields (messages[0].content)."""

    path: str
    code: str
    message: str


def field_path(parts: tuple) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _parts(link: tuple | None) -> tuple:
    parts: list = []
    while link is not None:
        link, part = link
        parts.append(part)
    return tuple(reversed(parts))


def json_problem(value: object, *, max_depth: int = MAX_JSON_DEPTH, nul: bool = True) -> Problem | None:
    """The first structural problem of a parsed JSON value: nested deeper than `max_depth`
    (containers count, the outermost is level 1), or (with `nul`) a NUL in a string or a key.
    Iterative, so a value of any depth is checked without recursion."""
    stack: list[tuple[object, tuple | None, int]] = [(value, None, 1)]
    while stack:
        node, link, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > max_depth:
                # Named by its outermost field: a path max_depth long would name nothing a reader finds.
                return Problem(
                    field_path(_parts(link)[:1]),
                    "nesting_too_deep",
                    f"nested too deep; JSON may nest at most {max_depth} levels of objects and arrays.",
                )
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, child in items:
                if nul and isinstance(key, str) and "\x00" in key:
                    return Problem(field_path(_parts(link)), "invalid_value", "a key holds a NUL character (U+0000).")
                if isinstance(child, dict | list) or (nul and isinstance(child, str)):
                    stack.append((child, (link, key), depth + 1))
        elif isinstance(node, str) and "\x00" in node:
            return Problem(
                field_path(_parts(link)), "invalid_value", "NUL characters (U+0000) cannot be stored; remove them."
            )
    return None


def strings_at(value: object, path: tuple) -> Iterator[tuple[tuple, str]]:
    """The strings found at `path` in a parsed JSON value (`"*"` in the path: every key of an
    object; `"*key"`: the keys themselves), with where each was found."""
    if not path:
        if isinstance(value, str):
            yield (), value
        return
    head, rest = path[0], path[1:]
    if not isinstance(value, dict):
        return
    if head == "*key":
        for key in value:
            yield (), key
    elif head == "*":
        for key, child in value.items():
            for where, found in strings_at(child, rest):
                yield (key, *where), found
    elif head in value:
        for where, found in strings_at(value[head], rest):
            yield (head, *where), found


def identifier_problem(value: object, identifiers: tuple[tuple, ...]) -> Problem | None:
    """The first identifier (each a path for strings_at) holding a control character."""
    for path in identifiers:
        for where, found in strings_at(value, path):
            char = control_character(found)
            if char is not None:
                name = field_path(where or path[:-1])
                what = "its keys" if path[-1] == "*key" else "it"
                return Problem(name, "invalid_value", f"control characters are not allowed in {what} ({char} found).")
    return None


# --- Django: validators and forms ----------------------------------------------------------------


@deconstructible
class NoControlCharacters:
    """Django validator: no control character (`multiline`: tabs and line breaks allowed)."""

    def __init__(self, multiline: bool = False) -> None:
        self.multiline = multiline

    def __call__(self, value: object) -> None:
        if isinstance(value, str):
            char = control_character(value, multiline=self.multiline)
            if char is not None:
                raise ValidationError(
                    "Control characters are not allowed (%(char)s found).",
                    code="control_character",
                    params={"char": char},
                )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NoControlCharacters) and other.multiline == self.multiline


@deconstructible
class StorableJSON:
    """Django validator for JSON values: bounded nesting and no NUL."""

    def __call__(self, value: object) -> None:
        problem = json_problem(value)
        if problem is not None:
            where = f" (at {problem.path})" if problem.path else ""
            raise ValidationError(problem.message[:1].upper() + problem.message[1:] + where, code=problem.code)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StorableJSON)


no_control_characters = NoControlCharacters()
no_control_characters_but_line_breaks = NoControlCharacters(multiline=True)
storable_json = StorableJSON()


def validators_for(field) -> list:
    """What a form field needs: JSON checked whole, text areas free text, every other text a name."""
    from django import forms
    from django.contrib.postgres.forms import SimpleArrayField

    if isinstance(field, SimpleArrayField):
        return validators_for(field.base_field)
    if isinstance(field, forms.JSONField):
        return [storable_json]
    if isinstance(field, forms.CharField):
        if isinstance(field.widget, forms.Textarea):
            return [no_control_characters_but_line_breaks]
        return [no_control_characters]
    return []


def _not_storable(what: str, text: str) -> NoReturn:
    raise json.JSONDecodeError(f"{what} ({text[:20]}) cannot be stored", text, 0)


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        _not_storable(f"A number of more than {MAX_JSON_INT_DIGITS} digits", text)
    return int(text)


def _finite_float(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        _not_storable("A number past a double's range", text)
    return number


def _no_constant(text: str) -> NoReturn:
    _not_storable("NaN or Infinity", text)


class StorableJSONDecoder(json.JSONDecoder):
    """What a console JSON field reads: Python's decoder takes NaN and Infinity, which JSON and
    PostgreSQL's jsonb do not (the save would fail), and raises a plain ValueError on an integer of
    over 4,300 digits, which Django's JSONField does not catch (a 500). Each is a form error here."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.update(parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant)
        super().__init__(*args, **kwargs)


def refuse_control_characters(fields: dict) -> None:
    """Add the validators each of a form's fields needs (once, however often it is called), and
    read JSON fields with StorableJSONDecoder."""
    from django import forms
    from django.contrib.postgres.forms import SimpleArrayField

    for field in fields.values():
        if isinstance(field, forms.JSONField) and field.decoder in (None, json.JSONDecoder):
            field.decoder = StorableJSONDecoder
        target = field.base_field if isinstance(field, SimpleArrayField) else field
        for validator in validators_for(field):
            if validator not in target.validators:
                target.validators.append(validator)


class PlainTextForm:
    """Form mixin: every text field refuses control characters (text areas: but line breaks), every
    JSON field NUL and deep nesting; each a clear error on its field."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        refuse_control_characters(self.fields)


def plain_text_form(form_class: type) -> type:
    if issubclass(form_class, PlainTextForm):
        return form_class
    return type(form_class)(form_class.__name__, (PlainTextForm, form_class), {"__module__": form_class.__module__})


class PlainTextAdmin:
    """ModelAdmin mixin: the forms it shows are PlainTextForms, declared fields included."""

    def get_form(self, request, obj=None, change=False, **kwargs):
        return plain_text_form(super().get_form(request, obj, change, **kwargs))


class PlainTextInline:
    """InlineModelAdmin mixin: likewise for the forms of its formset."""

    def get_formset(self, request, obj=None, **kwargs):
        formset = super().get_formset(request, obj, **kwargs)
        formset.form = plain_text_form(formset.form)
        return formset


def count_text(count: int, noun: str, plural: str | None = None) -> str:
    """`1 deployment`, `2 deployments` (never `deployment(s)`)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
