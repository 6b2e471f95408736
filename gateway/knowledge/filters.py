"""OpenAI's attribute filters for vector store search, as SQL over a store file's `attributes`.

A comparison filter is `{"type": "eq"|"ne"|"gt"|"gte"|"lt"|"lte"|"in"|"nin", "key", "value"}`; a
compound one `{"type": "and"|"or", "filters": [...]}`, nested at most MAX_DEPTH deep with at most
MAX_COMPARISONS comparisons in all. eq/ne/in/nin compare JSON values (1 equals 1.0; a string never
equals a number); gt/gte/lt/lte compare numbers with numbers and strings with strings, and a file
whose attribute is missing or of the other type does not match them. `ne` and `nin` match a file
without the attribute. Keys and values reach SQL only as parameters.
"""

from __future__ import annotations

from typing import Annotated, Literal

import orjson
from pydantic import Field

from gateway.schemas import _Strict

MAX_DEPTH = 4
MAX_COMPARISONS = 32
Scalar = Annotated[str, Field(max_length=512)] | float | bool


class Comparison(_Strict):
    type: Literal["eq", "ne", "gt", "gte", "lt", "lte", "in", "nin"]
    key: Annotated[str, Field(min_length=1, max_length=64)]
    value: Scalar | Annotated[list[Annotated[str, Field(max_length=512)] | float], Field(min_length=1, max_length=100)]


class Compound(_Strict):
    type: Literal["and", "or"]
    filters: Annotated[list[Comparison | Compound], Field(min_length=1, max_length=MAX_COMPARISONS)]


Filter = Comparison | Compound
_RANGE = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


class FilterError(ValueError):
    """A filter this cannot apply; the text says why (a 400 naming `filters`)."""


def to_sql(node: Filter, column: str = "e.attributes") -> tuple[str, dict]:
    """A WHERE clause over `column` and its parameters, named filter_0, filter_1, ... (the search's
    statement names its own)."""
    sql, params = _clause(node, column, 1, [0])
    pieces = sql.split("%s")
    named = pieces[0] + "".join(f"%(filter_{n})s{piece}" for n, piece in enumerate(pieces[1:]))
    return named, {f"filter_{n}": param for n, param in enumerate(params)}


def _clause(node: Filter, column: str, depth: int, count: list[int]) -> tuple[str, list]:
    if depth > MAX_DEPTH:
        raise FilterError(f"filters nest at most {MAX_DEPTH} levels deep")
    if isinstance(node, Compound):
        parts = [_clause(child, column, depth + 1, count) for child in node.filters]
        joined = f" {node.type.upper()} ".join(f"({sql})" for sql, _ in parts)
        return joined, [param for _, params in parts for param in params]
    count[0] += 1
    if count[0] > MAX_COMPARISONS:
        raise FilterError(f"at most {MAX_COMPARISONS} comparisons in all")
    value = node.value
    if node.type in ("in", "nin"):
        if not isinstance(value, list):
            raise FilterError(f"'{node.type}' compares with a list of values")
        member = f"({column} -> %s) = ANY(%s::jsonb[])"
        params = [node.key, [orjson.dumps(item).decode() for item in value]]
        return (member if node.type == "in" else f"NOT coalesce({member}, false)"), params
    if isinstance(value, list):
        raise FilterError(f"'{node.type}' compares with one value, not a list")
    if node.type == "eq":
        return f"({column} -> %s) = %s::jsonb", [node.key, orjson.dumps(value).decode()]
    if node.type == "ne":
        return f"({column} -> %s) IS DISTINCT FROM %s::jsonb", [node.key, orjson.dumps(value).decode()]
    if isinstance(value, bool):
        raise FilterError(f"'{node.type}' compares numbers or strings, not true or false")
    operator = _RANGE[node.type]
    if isinstance(value, str):
        return (
            f"jsonb_typeof({column} -> %s) = 'string' AND ({column} ->> %s) COLLATE \"C\" {operator} %s",
            [node.key, node.key, value],
        )
    return (
        f"jsonb_typeof({column} -> %s) = 'number' AND ({column} ->> %s)::numeric {operator} %s",
        [node.key, node.key, value],
    )
