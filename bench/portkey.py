"""The second peer: Portkey's open-source gateway (`@portkey-ai/gateway` from the npm registry),
installed once with npm into a folder under the bench data directory and run as one Node process
(`node build/start-server.js`), pointed at the same mock provider as Sentinel through its
`openai` provider with a custom host.

It keeps no keys, budgets or logs: it accepts any `authorization` and forwards it. Non-streamed
requests only: its streaming fails on this machine's Node 20 (an undici "immutable" headers error in
its header handling), so the overhead scenario measures it on the non-stream loads alone.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from sentinel.run import Child

VERSION = "1.15.2"
PACKAGE = f"@portkey-ai/gateway@{VERSION}"
INSTALL_TIMEOUT_SECONDS = 600
CONDITIONS = (
    f"Portkey gateway {VERSION} (npm), one Node process, provider openai with a custom host: no keys, "
    "budgets or logs on its side; non-stream only (its streaming fails on Node 20 here)"
)


class PeerUnavailable(Exception):
    """Portkey cannot take part in this run; the message says why."""


def folder(data_dir: Path) -> Path:
    return data_dir / "portkey"


def ensure_installed(data_dir: Path) -> Path:
    """The gateway's start script, installing the package the first time (npm, about a minute)."""
    where = folder(data_dir)
    script = where / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    marker = where / ".installed"
    if script.exists() and marker.exists() and marker.read_text().strip() == PACKAGE:
        return script
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise PeerUnavailable("node and npm are needed for the Portkey peer")
    print(f"Installing the second peer ({PACKAGE}) into {where} (once)…", flush=True)
    where.mkdir(parents=True, exist_ok=True)
    try:
        install = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(where), PACKAGE],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise PeerUnavailable(f"could not install {PACKAGE}: {exc}") from None
    if install.returncode != 0 or not script.exists():
        tail = " | ".join((install.stderr or install.stdout).strip().splitlines()[-3:])
        raise PeerUnavailable(f"could not install {PACKAGE}: npm exited {install.returncode}: {tail}")
    marker.write_text(PACKAGE + "\n")
    return script


def start(data_dir: Path, log_dir: Path) -> tuple[Child, str]:
    """Start the gateway on a free port; returns its Child and base URL (not yet ready)."""
    from sentinel.startup import free_port

    script = ensure_installed(data_dir)
    port = free_port()
    # It reads only `--port=N` (`--port N` is ignored: it would start on 8787); `--headless` skips its
    # console UI. It binds every interface (its start script has no host option).
    child = Child("portkey", ["node", str(script), f"--port={port}", "--headless"])
    (log_dir / "portkey.log").unlink(missing_ok=True)
    env = {"PATH": shutil.which("node").rsplit("/", 1)[0] + ":/usr/bin:/bin", "NODE_ENV": "production"}
    child.start(log_dir, env)
    return child, f"http://127.0.0.1:{port}"


def headers(mock_url: str, provider: str = "bench") -> dict[str, str]:
    """What every request through Portkey carries: which provider, where it is, any key."""
    return {
        "x-portkey-provider": "openai",
        "x-portkey-custom-host": f"{mock_url}/p/{provider}/v1",
        "authorization": "Bearer sk-mock-peer",
    }


def version(data_dir: Path) -> str:
    marker = folder(data_dir) / ".installed"
    return VERSION if marker.exists() else ""
