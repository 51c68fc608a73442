"""The agent's configuration: one validated object built by the CLI and passed down."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contracts.errors import InvalidArgument
from contracts.registration import NAME_RE

_SERVER_RE = re.compile(r"(?P<host>[A-Za-z0-9.\-_]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})")


class DeviceRequest(BaseModel):
    """``--devices``: ``auto`` (every CUDA device torch sees) or ``cpu:N`` (N declared CPU slots)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["auto", "cpu"]
    count: int = 0

    @classmethod
    def parse(cls, text: str) -> DeviceRequest:
        text = text.strip().lower()
        if text == "auto":
            return cls(kind="auto")
        m = re.fullmatch(r"cpu:(\d+)", text)
        if not m or not 1 <= int(m.group(1)) <= 1024:
            raise InvalidArgument(f"--devices: expected 'auto' or 'cpu:N' with 1 <= N <= 1024, got {text!r}")
        return cls(kind="cpu", count=int(m.group(1)))


def parse_port_range(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*", text)
    if not m:
        raise InvalidArgument(f"--sync-ports: expected 'MIN-MAX', got {text!r}")
    lo, hi = int(m.group(1)), int(m.group(2))
    if not 1024 <= lo <= hi <= 65535:
        raise InvalidArgument(f"--sync-ports: need 1024 <= MIN <= MAX <= 65535, got {lo}-{hi}")
    return lo, hi


class AgentSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: str = Field(description="control plane gRPC address, HOST:PORT")
    token: str = Field("", description="enrollment token; not needed once the state file holds credentials")
    region: str
    cluster: str
    devices: DeviceRequest = DeviceRequest(kind="auto")
    price_per_device_hour: float = Field(ge=0)
    spot_price_per_device_hour: float = Field(0.0, ge=0)
    provider: str = ""
    jurisdiction: str = ""
    advertise_host: str = "127.0.0.1"
    sync_ports: tuple[int, int] = (29600, 29699)
    intra_bandwidth_gbps: float = Field(0.0, ge=0)
    probe_port: int = Field(
        0, ge=-1, le=65535, description="LinkProbeService port (0: any free one, -1: serve no probes)"
    )
    probe_bind: str = Field(
        "0.0.0.0", min_length=1, max_length=255, description="address the probe server binds"
    )
    hostname: str = Field(default_factory=socket.gethostname)
    work_dir: Path = Path("./cpn-agent")
    state_file: Path | None = None  # default: <work_dir>/agent-state.json
    rpc_timeout_s: float = Field(10.0, gt=0, description="deadline of every unary call")
    reconnect_min_s: float = Field(0.5, gt=0)
    reconnect_max_s: float = Field(
        2.0, gt=0, description="longest wait between reconnects (at most the server's heartbeat interval)"
    )
    kill_grace_s: float = Field(10.0, ge=0, description="SIGTERM to SIGKILL when stopping workers")
    log_lines_per_s: float = Field(50.0, gt=0, description="worker log lines forwarded per second")
    log_burst: int = Field(200, ge=1)
    metrics_min_interval_s: float = Field(
        0.1, ge=0, description="metrics of one task sent at most this often"
    )
    finished_retention_s: float = Field(
        600.0, gt=0, description="how long final states are re-sent on reconnect"
    )
    measure_profile: bool = Field(
        True, description="run the reference worker at start-up and register what it measured"
    )
    allow_command_override: bool = Field(
        False, description="honour a worker config's 'command' list instead of torchrun (tests only)"
    )

    @field_validator("server")
    @classmethod
    def _server(cls, v: str) -> str:
        if not _SERVER_RE.fullmatch(v):
            raise ValueError(f"--server: expected HOST:PORT, got {v!r}")
        return v

    @field_validator("region", "cluster")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError(f"must match [a-z0-9][a-z0-9-]{{0,62}}, got {v!r}")
        return v

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, v: object) -> object:
        try:
            return DeviceRequest.parse(v) if isinstance(v, str) else v
        except InvalidArgument as exc:
            raise ValueError(exc.message) from None

    @field_validator("sync_ports", mode="before")
    @classmethod
    def _ports(cls, v: object) -> object:
        try:
            return parse_port_range(v) if isinstance(v, str) else v
        except InvalidArgument as exc:
            raise ValueError(exc.message) from None

    @field_validator("probe_port")
    @classmethod
    def _probe_port(cls, v: int) -> int:
        if v not in (-1, 0) and not 1024 <= v <= 65535:
            raise ValueError(f"--probe-port: -1 (none), 0 (any free port) or 1024..65535, got {v}")
        return v

    @model_validator(mode="after")
    def _backoff(self) -> AgentSettings:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")
        return self

    @property
    def effective_state_file(self) -> Path:
        return self.state_file or self.work_dir / "agent-state.json"
