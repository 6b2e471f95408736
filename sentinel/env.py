"""Typed readers of environment variables. Each records the variable it reads, with its default and
meaning, in ENV_VARS: the one list the configuration table in docs/configuration.md is checked against."""

from __future__ import annotations

import os
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR_DEFAULT = ".data"


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    help: str


ENV_VARS: list[EnvVar] = []


def read_env(name: str, default: object, help: str) -> str | None:
    ENV_VARS.append(EnvVar(name, "" if default is None else str(default), help))
    value = os.environ.get(name)
    return None if value is None or value == "" else value


def envstr(name: str, default: str, help: str) -> str:
    value = read_env(name, default, help)
    return default if value is None else value


def envbool(name: str, default: bool, help: str) -> bool:
    value = read_env(name, "true" if default else "false", help)
    if value is None:
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, not {value!r}")


def envint(name: str, default: int, help: str) -> int:
    value = read_env(name, default, help)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, not {value!r}") from None


def envfloat(name: str, default: float, help: str) -> float:
    value = read_env(name, default, help)
    if value is None:
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number, not {value!r}") from None


def envusd(name: str, default: str, help: str) -> Decimal:
    """A non-negative amount of money, exact (never a float)."""
    value = read_env(name, default, help)
    try:
        amount = Decimal(default if value is None else value)
    except ArithmeticError:
        amount = None
    if amount is None or not amount.is_finite() or amount < 0:
        raise ValueError(f"{name} must be a non-negative amount, not {value!r}")
    return amount


def envlist(name: str, default: str, help: str) -> list[str]:
    return [item.strip() for item in envstr(name, default, help).split(",") if item.strip()]


def data_dir() -> Path:
    """SENTINEL_DATA_DIR, relative to the project unless absolute: settings.DATA_DIR, and the folder the
    entry points start the embedded servers in, before settings are read (sentinel.embedded)."""
    path = Path(os.environ.get("SENTINEL_DATA_DIR") or DATA_DIR_DEFAULT)
    return path if path.is_absolute() else BASE_DIR / path
