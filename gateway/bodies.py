"""What every JSON body the API accepts must be, checked as soon as it is parsed and before anything
reads, keys on, stores or serialises it (sentinel.text has the rules): nested at most
MAX_JSON_DEPTH levels, no NUL anywhere (values and keys, message content included: PostgreSQL cannot
store it in the ledger, the cache or a batch, and prompt logging would carry it), and the fields the
gateway keys on or stores without control characters. Each refusal is a 400 naming the field.
Sizes are bounded before parsing, on the raw body (gateway.http, sentinel.asgi; batch lines in
gateway.batches.validation)."""

from __future__ import annotations

from gateway.errors import GatewayError, invalid_request
from sentinel.text import MAX_JSON_DEPTH, Problem, identifier_problem, json_problem

# Strings of a chat request that are keyed on, stored or passed on as ids (OpenAI's `user`,
# `safety_identifier` and `prompt_cache_key` identify end users and cache partitions upstream).
CHAT_IDENTIFIERS = (
    ("model",),
    ("user",),
    ("safety_identifier",),
    ("prompt_cache_key",),
    ("metadata", "*key"),
    ("metadata", "*"),
    ("cache", "namespace"),
)
BATCH_CREATE_IDENTIFIERS = (("input_file_id",), ("metadata", "*key"), ("metadata", "*"))


def _error(problem: Problem, prefix: str) -> GatewayError:
    param = ".".join(part for part in (prefix, problem.path) if part) or None
    message = f"Invalid value for '{param}': {problem.message}" if param else problem.message
    return invalid_request(message, param=param, code=problem.code)


def _may_be_too_deep(raw: bytes | str | None) -> bool:
    # Every level opens with a bracket, so a body with few of them cannot nest deep: most chat
    # requests skip the walk.
    if raw is None:
        return True
    opening = (b"{", b"[") if isinstance(raw, bytes) else ("{", "[")
    return raw.count(opening[0]) + raw.count(opening[1]) > MAX_JSON_DEPTH


def _may_hold_nul(raw: bytes | str | None) -> bool:
    # JSON can carry NUL only escaped (a raw one is invalid JSON).
    if raw is None:
        return True
    return (b"\\u0000" if isinstance(raw, bytes) else "\\u0000") in raw


def check_body(
    body: dict,
    *,
    identifiers: tuple[tuple, ...] = CHAT_IDENTIFIERS,
    raw: bytes | str | None = None,
    prefix: str = "",
) -> None:
    """Raise GatewayError(400) naming the first field at fault. `raw`, the body as received, lets a
    body that cannot nest deep or hold a NUL skip the walk; `prefix` names where the body sits (a
    batch line's `body`)."""
    deep, nul = _may_be_too_deep(raw), _may_hold_nul(raw)
    if deep or nul:
        problem = json_problem(body, max_depth=MAX_JSON_DEPTH if deep else 1 << 30, nul=nul)
        if problem is not None:
            raise _error(problem, prefix)
    problem = identifier_problem(body, identifiers)
    if problem is not None:
        raise _error(problem, prefix)


# --- the same rules in the OpenAPI schema ------------------------------------------------------------

NO_NUL = "^[^\\u0000]*$"
NO_CONTROL = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
STORABLE_JSON = "StorableJSON"
_STORABLE_REF = {"$ref": f"#/components/schemas/{STORABLE_JSON}"}


def _storable(node: object) -> object:
    """The JSON Schema `node` with what check_body refuses documented: a NUL in any string or key
    (free-form values become StorableJSON). Depth cannot be said in JSON Schema; the descriptions
    say it."""
    if not isinstance(node, dict):
        return node
    if not node:
        return _STORABLE_REF
    types = node.get("type")
    if types == "string" or (isinstance(types, list) and "string" in types):
        node.setdefault("pattern", NO_NUL)
    if types == "object":
        node.setdefault("propertyNames", {"pattern": NO_NUL})
        if node.get("additionalProperties", True) is True:
            node["additionalProperties"] = _STORABLE_REF
    for key in ("properties", "patternProperties"):
        for name, child in node.get(key, {}).items():
            node[key][name] = _storable(child)
    for key in ("items", "additionalProperties", "not", "if", "then", "else", "contains"):
        if isinstance(node.get(key), dict):
            node[key] = _storable(node[key])
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(node.get(key), list):
            node[key] = [_storable(child) for child in node[key]]
    return node


def _identifier(node: dict) -> None:
    for member in [node, *node.get("anyOf", [])]:
        if member.get("type") == "string":
            member["pattern"] = NO_CONTROL


def document_limits(components: dict, *, prefix: str, component: str, identifiers: tuple[tuple, ...]) -> None:
    """Say in the OpenAPI schema of `component` (and the components of its nested models, named with
    `prefix`) what check_body refuses, so that clients and the fuzzer know."""
    components[STORABLE_JSON] = {
        "description": f"Any JSON value without NUL (U+0000), nested at most {MAX_JSON_DEPTH} levels.",
        "anyOf": [
            {"type": ["null", "boolean", "number"]},
            {"type": "string", "pattern": NO_NUL},
            {"type": "array", "items": _STORABLE_REF},
            {"type": "object", "propertyNames": {"pattern": NO_NUL}, "additionalProperties": _STORABLE_REF},
        ],
    }
    for name in [n for n in components if n.startswith(prefix) and n != STORABLE_JSON]:
        _storable(components[name])
    properties = components[component].get("properties", {})
    for path in identifiers:
        node = properties.get(path[0])
        if node is None:
            continue
        if len(path) == 1:
            _identifier(node)
        elif path[1] in ("*", "*key") and isinstance(node, dict):
            for member in [node, *node.get("anyOf", [])]:
                if member.get("type") == "object":
                    if path[1] == "*key":
                        member["propertyNames"] = {"pattern": NO_CONTROL}
                    elif isinstance(member.get("additionalProperties"), dict):
                        _identifier(member["additionalProperties"])
    components[component]["description"] = (
        components[component].get("description", "")
        + f" Nested at most {MAX_JSON_DEPTH} levels; no NUL (U+0000) in any string or key."
    ).strip()
