"""The requirement sets: each lock pins every file by hash, the runtime lock carries no test or bench
tool, torch is its CPU build, and every package the code imports is asked for in its own set."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ["requirements.txt", "requirements-bench.txt", "requirements-test.txt", "requirements-uv.txt"]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(lock: str) -> dict[str, tuple[str, int]]:
    """{package: (version, number of hashes)} of a lock."""
    pins: dict[str, tuple[str, int]] = {}
    current = None
    for line in (ROOT / lock).read_text().splitlines():
        if found := PIN.match(line):
            current = normalize(found.group(1))
            pins[current] = (found.group(2), 0)
        elif line.strip().startswith("--hash=sha256:") and current:
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
    return pins


def asked_for(in_file: str) -> set[str]:
    """The packages an .in file names, following its -r includes."""
    names: set[str] = set()
    for line in (ROOT / in_file).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            names |= asked_for(line[3:].strip())
        elif line and not line.startswith("-"):
            names.add(normalize(re.split(r"[\[=!<>~; ]", line, maxsplit=1)[0]))
    return names


def imported(*folders: str) -> set[str]:
    """The distributions whose modules the code in these folders imports (standard library and
    the project's own packages left out)."""
    by_module = importlib.metadata.packages_distributions()
    own = {"sentinel", "tenants", "billing", "gateway", "bench", "tests"}
    found: set[str] = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            if any(part.startswith(".") for part in path.relative_to(ROOT).parts):
                continue  # not the project's: e.g. bench/.peer-venv, the peer `make bench` installs
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top in sys.stdlib_module_names or top in own or top == "__future__":
                        continue
                    assert top in by_module, f"{path}: {top} is imported but not installed"
                    found |= {normalize(name) for name in by_module[top]}
    return found


@pytest.mark.parametrize("lock", LOCKS)
def test_every_locked_package_is_pinned_by_hash(lock):
    pins = locked(lock)
    assert pins, f"{lock} pins nothing: the test reads the wrong thing"
    assert [name for name, (_, hashes) in pins.items() if hashes == 0] == []


def test_the_runtime_lock_holds_no_test_or_bench_tool():
    runtime = set(locked("requirements.txt"))
    tools = {"pytest", "pytest-django", "hypothesis", "playwright", "schemathesis", "ruff", "matplotlib", "py-spy"}
    assert runtime & tools == set()
    assert tools <= set(locked("requirements-test.txt"))


def test_each_lock_keeps_the_versions_of_the_one_below():
    runtime, bench, test = (locked(lock) for lock in LOCKS[:3])
    assert {name: bench[name][0] for name in runtime} == {name: version for name, (version, _) in runtime.items()}
    assert {name: test[name][0] for name in bench} == {name: version for name, (version, _) in bench.items()}


def test_torch_is_the_cpu_build_and_nothing_of_cuda_is_locked():
    for lock in LOCKS[:3]:
        pins = locked(lock)
        assert pins["torch"][0].endswith("+cpu")
        assert [name for name in pins if name.startswith(("nvidia-", "triton"))] == []


@pytest.mark.parametrize(
    ("folders", "in_file"),
    [
        (("sentinel", "tenants", "billing", "gateway"), "requirements.in"),
        (("bench",), "requirements-bench.in"),
        (("tests",), "requirements-test.in"),
    ],
)
def test_every_imported_package_is_asked_for_in_its_set(folders, in_file):
    assert imported(*folders) - asked_for(in_file) == set()
