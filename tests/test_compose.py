"""docker-compose.yml and Dockerfile, checked without a Docker engine: services and their order,
health-gated dependencies, environment that the programs really read, commands that really exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from cpn.cli import app as cli_app
from orchestration.settings import Settings
from service_layer.routers.health import router as health_router

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
CLI: Any = typer.main.get_command(cli_app)  # typer's own click: groups are told apart by .commands
SHELL_OPERATORS = {"||", "&&", ";", "|", ">", ">>", "<"}


def _envvars(command: Any) -> set[str]:
    found = {p.envvar for p in command.params if isinstance(p.envvar, str)}
    for sub in getattr(command, "commands", {}).values():
        found |= _envvars(sub)
    return found


def _cpn_invocations(service: dict[str, Any]) -> list[list[str]]:
    """Every `cpn ...` argv in a service's command (list form or `sh -c` script)."""
    command = service.get("command")
    if command is None:
        return []
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if argv[:2] == ["sh", "-c"]:
        argv = shlex.split(argv[2].replace("$$", "$"))
    invocations, current = [], None
    for tok in argv:
        if tok in SHELL_OPERATORS:
            current = None
        elif tok == "cpn" and current is None:
            current = []
            invocations.append(current)
        elif current is not None:
            current.append(tok)
    return invocations


def _resolve(argv: list[str]) -> tuple[list[str], Any, list[str]]:
    """Walk the CLI tree: (subcommand path, the command, the remaining arguments)."""
    path, cmd, rest = [], CLI, list(argv)
    while hasattr(cmd, "commands") and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        assert name in cmd.commands, f"`cpn {' '.join([*path, name])}` is not a command"
        path.append(name)
        cmd = cmd.commands[name]
    return path, cmd, rest


def _agents() -> list[str]:
    return [n for n, s in SERVICES.items() if any(inv[:1] == ["agent"] for inv in _cpn_invocations(s))]


def test_services_and_their_order() -> None:
    assert {"postgres", "redis", "migrate", "control-plane"} <= set(SERVICES)
    assert len(_agents()) == 2
    cp = SERVICES["control-plane"]["depends_on"]
    assert cp["migrate"]["condition"] == "service_completed_successfully"
    assert cp["postgres"]["condition"] == cp["redis"]["condition"] == "service_healthy"
    assert SERVICES["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for agent in _agents():
        assert SERVICES[agent]["depends_on"]["control-plane"]["condition"] == "service_healthy"


def test_every_dependency_waits_on_health_or_completion() -> None:
    for name, service in SERVICES.items():
        deps = service.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on must give conditions"
        for dep, spec in deps.items():
            assert dep in SERVICES, f"{name} depends on unknown service {dep}"
            condition = spec["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[dep], f"{name} waits for {dep}'s health, which has no check"
            else:
                assert condition == "service_completed_successfully", (name, dep, condition)
                assert SERVICES[dep].get("restart") == "no", f"{dep} is one-shot and must not restart"


def test_long_running_services_have_healthchecks() -> None:
    for name, service in SERVICES.items():
        if service.get("restart") == "no":
            continue
        check = service.get("healthcheck")
        assert check and check["test"], f"{name} has no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
    cp_check = " ".join(SERVICES["control-plane"]["healthcheck"]["test"])
    port = SERVICES["control-plane"]["environment"]["CPN_HTTP_PORT"]
    assert f"127.0.0.1:{port}/healthz" in cp_check
    assert "/healthz" in {r.path for r in health_router.routes}


def test_environment_maps_to_real_settings_and_cli_options() -> None:
    known = {f"CPN_{name.upper()}" for name in Settings.model_fields} | _envvars(CLI)
    for name, service in SERVICES.items():
        env = service.get("environment") or {}
        assert isinstance(env, dict), f"{name}: use the mapping form for environment"
        for key in env:
            if key.startswith("CPN_"):
                assert key in known, f"{name}: {key} is read by nothing (not a Settings field or CLI envvar)"
    env = SERVICES["control-plane"]["environment"]
    db = urlparse(env["CPN_DATABASE_URL"])
    assert db.scheme.startswith("postgresql") and db.hostname == "postgres" and db.path == "/cpn"
    assert urlparse(env["CPN_REDIS_URL"]).hostname == "redis"
    assert (
        env["CPN_ENVIRONMENT"] == "production" and "CPN_SECRET_KEY" in env
    )  # production refuses the default
    ports = {p.split(":")[1] for p in SERVICES["control-plane"]["ports"]}
    assert ports == {env["CPN_HTTP_PORT"], env["CPN_GRPC_PORT"]}


@pytest.mark.parametrize("service", sorted(n for n, s in SERVICES.items() if _cpn_invocations(s)))
def test_commands_are_real_cli_commands(service: str) -> None:
    runner = CliRunner()
    for argv in _cpn_invocations(SERVICES[service]):
        path, cmd, rest = _resolve(argv)
        result = runner.invoke(cli_app, [*path, "--help"])
        assert result.exit_code == 0, (service, path, result.output)
        options = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
        for tok in rest:
            if tok.startswith("-"):
                assert tok.split("=")[0] in options, f"{service}: `cpn {' '.join(path)}` has no option {tok}"
    for argv in _cpn_invocations(SERVICES[service]):
        if argv[:1] == ["agent"]:
            server = argv[argv.index("--server") + 1]
            host, port = server.rsplit(":", 1)
            assert host == "control-plane" and port == SERVICES[host]["environment"]["CPN_GRPC_PORT"]


def test_dockerfile_copies_every_package_and_runs_a_real_command() -> None:
    text = (ROOT / "Dockerfile").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    packages = re.findall(
        r'"(\w+)\*"', pyproject.split("[tool.setuptools.packages.find]")[1].split("\n\n")[0]
    )
    copied = set(re.findall(r"^COPY (\S+) ", text, flags=re.M))
    for src in copied:
        assert (ROOT / src).exists(), f"Dockerfile copies missing {src}"
    assert set(packages) <= copied, f"packages not copied: {set(packages) - copied}"
    cmd = yaml.safe_load(re.search(r"^CMD (.+)$", text, flags=re.M).group(1))  # JSON array
    assert cmd[0] == "cpn"
    path, _, _ = _resolve(cmd[1:])
    assert path == ["server"]
    assert SERVICES["migrate"]["build"] == "." and SERVICES["migrate"]["image"] == "cpn:latest"
