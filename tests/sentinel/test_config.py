"""Configuration: every environment variable is documented in docs/configuration.md, and bad values fail loudly."""

import re
from pathlib import Path

import pytest

import sentinel.demo
import sentinel.run  # noqa: F401 - registers its variables
from sentinel.env import ENV_VARS, envbool, envfloat, envint

TABLE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
COMPUTED_DEFAULTS = {"SENTINEL_WEB_WORKERS": "(one per core)"}


def documented_table() -> dict[str, str]:
    rows = re.findall(r"^\| `([A-Z_]+)` \| (.+?) \| (.+?) \|$", TABLE.read_text(), re.MULTILINE)
    return {name: default for name, default, _ in rows}


def test_every_variable_is_documented_with_its_default():
    table = documented_table()
    for var in ENV_VARS:
        assert var.name in table, f"{var.name} is missing from docs/configuration.md"
        expected = COMPUTED_DEFAULTS.get(var.name) or (f"`{var.default}`" if var.default else "(unset)")
        assert table[var.name] == expected, var.name


def test_the_docs_name_no_variable_the_code_does_not_read():
    assert set(documented_table()) == {var.name for var in ENV_VARS}


@pytest.mark.parametrize(("reader", "value"), [(envint, "ten"), (envfloat, "fast"), (envbool, "maybe")])
def test_bad_values_fail_loudly(monkeypatch, reader, value):
    monkeypatch.setenv("SENTINEL_TEST_VALUE", value)
    try:
        with pytest.raises(ValueError, match="SENTINEL_TEST_VALUE"):
            reader("SENTINEL_TEST_VALUE", 1, "test")
    finally:  # the readers record what they read: leave the registry as it was
        ENV_VARS[:] = [v for v in ENV_VARS if v.name != "SENTINEL_TEST_VALUE"]
