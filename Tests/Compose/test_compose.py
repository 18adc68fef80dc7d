"""compose/: the file is valid for docker-compose, and it runs every executable of the system."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
DOCKERFILE = ROOT / "compose" / "Dockerfile"
SERVICES = {"accounts": 9101, "tasks": 9102, "finance": 9103, "social": 9104, "matchmaking": 9105}


def test_docker_compose_config_accepts_the_file():
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (scripts/setup installs it)")
    env = dict(os.environ, SERVICE_TOKEN="s" * 40, GATEWAY_TOKEN="g" * 40)
    out = subprocess.run([exe, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)
    assert set(resolved["services"]) == set(SERVICES) | {"gateway"}
    # Both credentials are required: no well-known default to run with by mistake.
    bare = {k: v for k, v in os.environ.items() if k not in ("SERVICE_TOKEN", "GATEWAY_TOKEN")}
    missing = subprocess.run([exe, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=60, env=bare)
    assert missing.returncode != 0 and "SERVICE_TOKEN" in missing.stderr + missing.stdout


def test_the_gateway_never_gets_the_service_credential():
    doc = yaml.safe_load(COMPOSE.read_text())
    gateway_env = doc["services"]["gateway"]["environment"]
    assert "SERVICE_TOKEN" not in gateway_env and "GATEWAY_TOKEN" in gateway_env
    for name in SERVICES:
        env = doc["services"][name].get("environment") or doc["x-service"]["environment"]
        assert "SERVICE_TOKEN" in env and "GATEWAY_TOKEN" in env
        assert "change-me" not in str(env)


def test_every_executable_runs_in_a_container_with_its_volume_and_health_check():
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    for name, port in SERVICES.items():
        svc = services[name]
        assert svc["command"][0] == f"{name}-service"
        assert str(port) in svc["command"]
        assert any(v.startswith(f"{name}-data:") for v in svc["volumes"]), name
        assert "health-probe" in svc["healthcheck"]["test"]
        assert f"{name}-data" in doc["volumes"]
    gw = services["gateway"]
    assert gw["command"][0] == "gateway"
    assert set(gw["depends_on"]) == set(SERVICES)
    for name, port in SERVICES.items():
        assert gw["environment"][f"{name.upper()}_ADDR"] == f"{name}:{port}"


def test_dockerfile_copies_every_executable_that_the_package_declares():
    package = (ROOT / "Package.swift").read_text()
    declared = set(re.findall(r'\.executable\(name: "([a-z-]+)"', package))
    wanted = {e for e in declared if e.endswith("-service") or e in ("gateway", "health-probe")}
    docker = DOCKERFILE.read_text()
    for exe in wanted | {f"{s}-service" for s in SERVICES} | {"gateway", "health-probe"}:
        assert exe in docker, f"Dockerfile does not install {exe}"
