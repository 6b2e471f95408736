"""docker-compose.yml, the Dockerfile and the nginx config, checked without Docker (which cannot run
here): the YAML loads; every command names a module, app or management command that exists and
arguments its parser accepts; every variable is one Sentinel reads (sentinel.env) or a documented
third-party one; and `--scale web=N` works: no fixed host port or container name on web."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands, load_command_class

import sentinel.demo
import sentinel.run  # noqa: F401 - registers its variables
from sentinel import web
from sentinel.env import ENV_VARS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
SENTINEL_SERVICES = {name for name, service in SERVICES.items() if service.get("build") == "."}

# Variables read by something other than Sentinel's code, each documented in docs/.
THIRD_PARTY = {
    "POSTGRES_USER": "the postgres image",
    "POSTGRES_PASSWORD": "the postgres image",
    "POSTGRES_DB": "the postgres image",
    "FORWARDED_ALLOW_IPS": "uvicorn",
}


def interpolated(text: str) -> set[str]:
    """${VAR}, ${VAR:-default}, ${VAR:?message}: the variables compose reads from the shell."""
    return set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", text))


def check_command(argv: list[str]) -> None:
    """Fail unless the command would start something that exists, with arguments it accepts."""
    assert argv[0] == "python", argv
    if argv[1] == "manage.py":
        name = argv[2]
        assert name in get_commands(), f"no management command {name!r}"
        command = load_command_class(get_commands()[name], name)
        command.create_parser("manage.py", name).parse_args(argv[3:])
        return
    assert argv[1] == "-m", argv
    module, args = argv[2], argv[3:]
    assert importlib.util.find_spec(module) is not None, f"no module {module!r}"
    if module == "sentinel.web":
        web.parser().parse_args(args)
    elif module == "celery":
        assert args[:2] == ["-A", "sentinel"] and args[2] in ("worker", "beat"), args
        assert importlib.import_module("sentinel.celery").app.main == "sentinel"
    elif module == "gateway.mock_provider":
        assert "--port" in args and "--host" in args
    else:
        pytest.fail(f"unchecked module {module!r}: teach this test how to check it")


def test_every_sentinel_service_runs_a_command_that_exists():
    assert {"migrate", "web", "worker", "beat", "mock", "demo"} == SENTINEL_SERVICES
    for name in sorted(SENTINEL_SERVICES):
        check_command(SERVICES[name]["command"])


def test_the_dockerfile_default_command_exists():
    dockerfile = (ROOT / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE).group(1)
    check_command(json.loads(cmd))
    assert (ROOT / "requirements.txt").exists() and "COPY requirements.txt" in dockerfile


def test_every_variable_is_read_by_sentinel_or_documented():
    ours = {var.name for var in ENV_VARS}
    docs = "".join(page.read_text() for page in sorted((ROOT / "docs").glob("*.md")))
    used = interpolated((ROOT / "docker-compose.yml").read_text())
    for service in SERVICES.values():
        used |= set(service.get("environment") or {})
    assert used, "no variables found: the test reads the wrong thing"
    for name in sorted(used):
        if name in ours:
            continue
        assert name in THIRD_PARTY, f"{name} is neither read by Sentinel nor a known third-party variable"
        assert f"`{name}`" in docs, f"{name} ({THIRD_PARTY[name]}) is not documented in docs/"


def test_web_scales_out():
    web_service = SERVICES["web"]
    assert "ports" not in web_service, "a fixed host port on web makes --scale web=N clash"
    assert "container_name" not in web_service
    port = web_service["command"][web_service["command"].index("--port") + 1]
    assert web_service["expose"] == [port]
    assert web_service["environment"]["PROMETHEUS_MULTIPROC_DIR"]  # each replica adds up its workers
    nginx = (ROOT / "deploy" / "nginx.conf").read_text()
    assert re.search(rf"server web:{port};", nginx), "the load balancer does not point at web's port"
    assert re.search(r"location = /metrics \{\s*return 404;", nginx), "metrics are exposed through the LB"
    lb = SERVICES["lb"]
    assert lb["ports"] == [f"{port}:{port}"]
    assert "./deploy/nginx.conf:/etc/nginx/conf.d/default.conf:ro" in lb["volumes"]


def test_dependencies_name_real_services_and_start_in_order():
    for name, service in SERVICES.items():
        for dependency in service.get("depends_on") or []:
            assert dependency in SERVICES, f"{name} depends on unknown service {dependency}"
    for name in ("web", "worker", "beat", "demo"):
        assert SERVICES[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "migrate" not in SERVICES["migrate"]["depends_on"]


def test_the_demo_profile_points_at_the_mock_provider():
    mock, demo = SERVICES["mock"], SERVICES["demo"]
    assert mock["profiles"] == demo["profiles"] == ["demo"]
    port = mock["command"][mock["command"].index("--port") + 1]
    assert demo["command"][-2:] == ["--mock-url", f"http://mock:{port}"]
    assert demo["environment"]["SENTINEL_MOCK_URL"] == f"http://mock:{port}"
    assert all("profiles" not in SERVICES[name] for name in ("web", "worker", "beat", "lb", "postgres"))


def test_the_monitoring_profile_loads_sentinels_rules():
    prometheus = SERVICES["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    (target,) = config["scrape_configs"][0]["dns_sd_configs"]
    assert target["names"] == ["web"] and str(target["port"]) in SERVICES["web"]["expose"]


def test_mounted_files_exist():
    for service in SERVICES.values():
        for volume in service.get("volumes") or []:
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
