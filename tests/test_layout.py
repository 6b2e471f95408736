"""Which way imports go, read from the source (no servers): no import cycles between first-party
modules, and no module imports one in a layer above its own (docs/architecture.md). Imports inside
functions count (they hide a cycle, they do not break it); imports under `if TYPE_CHECKING:` do not
(they never run)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from gateway.batches import services
from sentinel.celery import app as celery_app
from tenants import webhooks

ROOT = Path(__file__).resolve().parents[1]
APPS = ("sentinel", "tenants", "billing", "gateway")

# The layers, bottom first: the project's own plumbing (settings, clients, localstate), tenants and
# billing, the gateway, and on top what composes them: the entry points and the console.
APP_LAYERS = {"tenants": 1, "billing": 1, "gateway": 2}
TOP = ("sentinel.asgi", "sentinel.urls", "sentinel.routing", "sentinel.run", "sentinel.web", "sentinel.demo")
TOP_PACKAGES = ("sentinel.console", "sentinel.management")


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


def layer(name: str) -> int:
    if name in TOP or name.startswith(TOP_PACKAGES):
        return 3
    return APP_LAYERS.get(name.split(".")[0], 0)


def is_app_admin(name: str) -> bool:
    """An app's admin module: registered on the console's site and built on its admin classes."""
    return name.split(".")[-1] == "admin" and layer(name) in (1, 2)


def test_no_import_cycles():
    edges = graph()
    assert "gateway.pipeline" in edges and "gateway.pipeline" in edges["gateway.http"]  # the graph is read
    assert cycles(edges) == []


def test_no_module_imports_a_layer_above_its_own():
    edges = graph()
    assert layer("sentinel.localstate") == 0 and layer("sentinel.console.views") == 3  # the layers are read
    assert "gateway.models" in edges["sentinel.console.filters"]  # a downward import, allowed
    upward = {
        (name, target)
        for name, targets in edges.items()
        for target in targets
        if layer(target) > layer(name) and not (is_app_admin(name) and target.startswith("sentinel.console"))
    }
    assert upward == set()


@pytest.mark.parametrize(
    "name", [services.START_BATCH, services.FINALIZE_BATCH, webhooks.DELIVER_WEBHOOK], ids=lambda name: name
)
def test_tasks_queued_by_name_are_registered(name):
    """Services queue their Celery tasks by name (the tasks import the services, not the reverse)."""
    importlib.import_module(name.rpartition(".")[0])
    assert celery_app.tasks[name].name == name
