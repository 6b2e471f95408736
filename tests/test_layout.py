"""Which way imports go, read from the source (no servers): no import cycles between first-party
modules but the known Celery task ones, and tenants and billing import nothing from the gateway above
them. Imports inside functions count (they hide a cycle, they do not break it); imports under
`if TYPE_CHECKING:` do not (they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APPS = ("sentinel", "tenants", "billing", "gateway")

# Services that queue a task which calls back into them: the usual shape of Celery code, kept.
KNOWN_CYCLES = [
    ["gateway.batches.runner", "gateway.batches.services", "gateway.batches.tasks"],
    ["tenants.tasks", "tenants.webhooks"],
]
# The tenants admin empties a tenant's cache entries; gateway/cache/ is being rewritten elsewhere.
KNOWN_UPWARD = {("tenants.admin", "gateway.cache.services")}


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[0] in APPS and "migrations" not in parts:
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """First-party modules `name` imports, anywhere in it but under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for statement in block.body
        for node in ast.walk(statement)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets += [f"{base}.{alias.name}" for alias in node.names] + [base]
    found = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(edges[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_import_cycles_but_the_known_celery_ones():
    edges = graph()
    assert "gateway.pipeline" in edges and "gateway.pipeline" in edges["gateway.http"]  # the graph is read
    assert cycles(edges) == KNOWN_CYCLES


def test_tenants_and_billing_import_nothing_from_the_gateway():
    upward = {
        (name, target)
        for name, targets in graph().items()
        if name.split(".")[0] in ("tenants", "billing")
        for target in targets
        if target.startswith("gateway")
    }
    assert upward == KNOWN_UPWARD
