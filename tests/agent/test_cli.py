"""``cpn agent``'s options reach the agent's settings by name, the renamed ones converted."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent import cli as agent_cli
from agent.settings import AgentSettings
from cpn.cli import app

REQUIRED = ["agent", "--server", "127.0.0.1:7000", "--region", "eu-west", "--cluster", "c1"]


def _settings(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, AgentSettings | None, str]:
    seen: list[AgentSettings] = []

    def run(settings: AgentSettings) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr(agent_cli, "run_agent", run)
    result = CliRunner().invoke(app, [*REQUIRED, *args])
    return result.exit_code, (seen[0] if seen else None), result.output


def test_every_option_reaches_the_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    code, settings, output = _settings(
        monkeypatch,
        "--price-per-device-hour", "2.5",
        "--spot-price", "1.25",
        "--devices", "cpu:3",
        "--sync-ports", "30000-30010",
        "--work-dir", str(tmp_path),
        "--reconnect-max-s", "0.2",
        "--cache-max-gb", "1.5",
        "--pip-arg", "--index-url=http://mirror", "--pip-arg", "--no-cache-dir",
        "--node-fabric-gbps", "25",
        "--profile-share-s", "60",
        "--allow-unsandboxed",
    )  # fmt: skip
    assert code == 0, output
    assert settings is not None
    assert (settings.price_per_device_hour, settings.spot_price_per_device_hour) == (2.5, 1.25)
    assert (settings.devices.kind, settings.devices.count) == ("cpu", 3)
    assert settings.sync_ports == (30000, 30010)
    assert settings.work_dir == tmp_path
    # Derived: the shortest reconnect wait never above the longest, the cache in bytes.
    assert (settings.reconnect_min_s, settings.reconnect_max_s) == (0.2, 0.2)
    assert settings.cache_max_bytes == 1_500_000_000
    assert settings.pip_args == ("--index-url=http://mirror", "--no-cache-dir")
    assert settings.node_fabric_gbps == 25.0 and settings.allow_unsandboxed
    assert settings.profile_share_s == 60.0


def test_an_invalid_setting_is_named_and_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    code, settings, output = _settings(monkeypatch, "--price-per-device-hour", "1", "--devices", "gpu:2")
    assert code == 2 and settings is None
    assert "cpn agent: devices:" in output


def test_the_slurm_backend_takes_its_settings_as_key_value_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    code, settings, output = _settings(
        monkeypatch,
        "--price-per-device-hour", "1",
        "--backend", "slurm",
        "--slurm", "partition=gpu", "--slurm", "account=proj42", "--slurm", "poll_s=0.5",
        "--slurm", "gpu_memory_gb=40", "--slurm", "gpu_tflops=150",
    )  # fmt: skip
    assert code == 0, output
    assert settings is not None and settings.backend == "slurm"
    assert (settings.slurm_partition, settings.slurm_account, settings.slurm_poll_s) == ("gpu", "proj42", 0.5)
    assert (settings.slurm_gpu_memory_gb, settings.slurm_gpu_tflops) == (40.0, 150.0)
    _, default, _ = _settings(monkeypatch, "--price-per-device-hour", "1")
    assert default is not None and default.backend == "local"
    code, settings, output = _settings(monkeypatch, "--price-per-device-hour", "1", "--slurm", "queue=gpu")
    assert code == 2 and settings is None and "--slurm: expected KEY=VALUE" in output
    code, settings, output = _settings(monkeypatch, "--price-per-device-hour", "1", "--backend", "k8s")
    assert code == 2 and settings is None and "cpn agent: backend:" in output


def test_the_nccl_environment_takes_its_settings_as_key_value_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    code, settings, output = _settings(
        monkeypatch,
        "--price-per-device-hour", "1",
        "--nccl", "socket_ifname=^docker,lo", "--nccl", "ib_hca=mlx5_0:1,mlx5_1:1",
        "--nccl", "timeout_s=300", "--nccl", "debug=info",
    )  # fmt: skip
    assert code == 0, output
    assert settings is not None
    assert (settings.nccl_socket_ifname, settings.nccl_ib_hca) == ("^docker,lo", "mlx5_0:1,mlx5_1:1")
    assert (settings.nccl_timeout_s, settings.nccl_debug) == (300.0, "INFO")
    code, settings, output = _settings(monkeypatch, "--price-per-device-hour", "1", "--nccl", "ifname=eth0")
    assert code == 2 and settings is None and "--nccl: expected KEY=VALUE" in output
    code, settings, output = _settings(monkeypatch, "--price-per-device-hour", "1", "--nccl", "ib_hca=mlx5 0")
    assert code == 2 and settings is None and "cpn agent: nccl_ib_hca: Value error, --nccl ib_hca:" in output
