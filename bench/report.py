"""What every scenario's results carry (machine, date, commit, versions) and how they are shown:
a plain-text table on stdout, JSON in bench/results/<scenario>.json, and PNG plots."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import orjson
import psutil

from bench.stack import BASE_DIR


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        # The machine is shared: the load before a run says how quiet it was.
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def git_commit() -> dict:
    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=BASE_DIR, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": git("rev-parse", "HEAD"),
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def versions(*extra: tuple[str, str]) -> dict:
    found = {}
    for package in ("django", "litellm", "uvicorn", "uvloop", "aiohttp", "redis", "psycopg", "celery"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    found.update(extra)
    return found


def envelope(scenario: str, *, quick: bool, **extra_versions: str) -> dict:
    """The fields every result file starts with."""
    return {
        "scenario": scenario,
        "quick": quick,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "git": git_commit(),
        "versions": versions(*extra_versions.items()),
    }


def write_json(out_dir: Path, scenario: str, data: dict) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{scenario}.json"
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    return path


def fmt(value, digits: int | None = None) -> str:
    """Numbers as a reader wants them: small ones with two decimals, larger ones with one."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if digits is None:
            digits = 2 if abs(value) < 10 else 1
        return f"{value:,.{digits}f}"
    return str(value)


def table(headers: list[str], rows: list[list], title: str = "") -> str:
    """A plain-text table, numbers right-aligned."""
    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]

    def line(values: list[str], numeric: list[bool]) -> str:
        return "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric, strict=True))

    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in rows) for i in range(len(headers))]
    out = [title] if title else []
    out.append(line(headers, numeric))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r, numeric) for r in cells)
    return "\n".join(out)


def pyplot():
    """matplotlib without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
