"""The peer: the LiteLLM proxy, installed once into its own virtual environment (bench/.peer-venv) and
run with one worker, one model (`openai/mock`) pointing at the same mock provider as Sentinel.

It runs without a database: its virtual keys need a Prisma engine download that this machine cannot
do, so it accepts every request with no key (`dangerously_permit_weak_or_unset_master_key`). Results
say so; authentication, budgets and spend logs are therefore off on the peer's side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sentinel.run import Child

PEER_VERSION = "1.108.7"
PEER_REQUIREMENT = f"litellm[proxy]=={PEER_VERSION}"
VENV = Path(__file__).resolve().parent / ".peer-venv"
MARKER = VENV / ".installed"
INSTALL_TIMEOUT_SECONDS = 1200
MODEL = "mock"
CONDITIONS = (
    f"LiteLLM proxy {PEER_VERSION}, one worker, no database (its virtual keys need a Prisma engine download "
    "this machine cannot do): no key check, no budgets, no spend logs on its side"
)


class PeerUnavailable(Exception):
    """The peer cannot take part in this run; the message says why."""


def ensure_installed() -> Path:
    """The peer's `litellm` command, installing it the first time (about a minute, 750 MB)."""
    command = VENV / "bin" / "litellm"
    if command.exists() and MARKER.exists() and MARKER.read_text().strip() == PEER_REQUIREMENT:
        return command
    print(f"Installing the peer ({PEER_REQUIREMENT}) into {VENV} (once; about a minute)…", flush=True)
    try:
        if not (VENV / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True, timeout=300)
        install = subprocess.run(
            [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", PEER_REQUIREMENT],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise PeerUnavailable(f"could not install {PEER_REQUIREMENT}: {exc}") from None
    if install.returncode != 0 or not command.exists():
        tail = " | ".join((install.stderr or install.stdout).strip().splitlines()[-3:])
        raise PeerUnavailable(f"could not install {PEER_REQUIREMENT}: pip exited {install.returncode}: {tail}")
    MARKER.write_text(PEER_REQUIREMENT + "\n")
    return command


def config(mock_url: str, provider: str) -> dict:
    return {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": "openai/mock",
                    "api_base": f"{mock_url}/p/{provider}/v1",
                    "api_key": "sk-mock-peer",
                },
            }
        ],
        "general_settings": {"dangerously_permit_weak_or_unset_master_key": True},
    }


def start(mock_url: str, log_dir: Path, *, provider: str = "bench") -> tuple[Child, str]:
    """Start the proxy on a free port; returns its Child and base URL (not yet ready)."""
    from sentinel.startup import free_port

    command = ensure_installed()
    config_file = log_dir / "litellm-config.yaml"
    config_file.write_text(json.dumps(config(mock_url, provider), indent=2))  # JSON is YAML
    port = free_port()
    # A clean environment: the proxy reads DATABASE_URL / REDIS_URL itself and must not see ours.
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "TMPDIR") if name in os.environ}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY_DISABLED="true")
    child = Child(
        "litellm",
        [str(command), "--config", str(config_file), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
    )
    (log_dir / "litellm.log").unlink(missing_ok=True)
    child.start(log_dir, env)
    return child, f"http://127.0.0.1:{port}"


def version() -> str:
    return PEER_VERSION if MARKER.exists() else ""
