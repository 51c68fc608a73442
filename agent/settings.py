"""The agent's configuration: one validated object built by the CLI and passed down."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from agent.nccl_env import IB_HCA_RE, IFNAME_RE
from contracts.errors import InvalidArgument
from contracts.registration import MAX_FABRIC_GBPS, MAX_FABRIC_LATENCY_MS, NAME_RE

MAX_SERVERS = 16
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


def _addresses(v: str, flag: str) -> str:
    """One or more control-plane replicas, HOST:PORT[,HOST:PORT...] (tried in order, then around)."""
    parts = [p.strip() for p in v.split(",")]
    if not 1 <= len(parts) <= MAX_SERVERS:
        raise ValueError(f"{flag}: 1 to {MAX_SERVERS} addresses, got {len(parts)}")
    for part in parts:
        if not _SERVER_RE.fullmatch(part):
            raise ValueError(f"{flag}: expected HOST:PORT[,HOST:PORT...], got {part!r} in {v!r}")
    if len(set(parts)) != len(parts):
        raise ValueError(f"{flag}: an address is listed twice in {v!r}")
    return ",".join(parts)


class AgentSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: str = Field(
        description="control plane gRPC address, HOST:PORT, or several replicas' as HOST:PORT,HOST:PORT"
    )
    tls_ca_file: Path | None = Field(
        None, description="CA that signed the control plane's certificate: TLS when set, else plaintext"
    )
    tls_server_name: str | None = Field(
        None, max_length=253, description="name to verify in the server's certificate (default: its host)"
    )
    enroll_server: str | None = Field(
        None,
        description="mTLS: the enrollment port(s), HOST:PORT[,...]; the node registers there with a CSR "
        "and connects to --server with the certificate it gets",
    )
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
    # This node's own port into the cluster fabric where it is slower than the cluster's figure.
    node_fabric_gbps: float = Field(0.0, ge=0, le=MAX_FABRIC_GBPS, description="Gb/s; 0: none")
    node_fabric_latency_ms: float = Field(
        0.0, ge=0, le=MAX_FABRIC_LATENCY_MS, description="one-way ms across the fabric; 0: not declared"
    )
    cross_cluster_host: str = Field(
        "",
        max_length=255,
        description="Where other clusters, in any region, reach its torchrun endpoint; '': none",
    )
    probe_port: int = Field(
        0, ge=-1, le=65535, description="LinkProbeService port (0: any free one, -1: serve no probes)"
    )
    probe_bind: str = Field(
        "0.0.0.0", min_length=1, max_length=255, description="address the probe and checkpoint servers bind"
    )
    checkpoint_port: int = Field(
        0,
        ge=-1,
        le=65535,
        description="CheckpointService port, mutual TLS (0: any free one, -1: serve no checkpoint copies)",
    )
    hostname: str = Field(default_factory=socket.gethostname)
    work_dir: Path = Path("./cpn-agent")
    state_file: Path | None = None  # default: <work_dir>/agent-state.json
    rpc_timeout_s: float = Field(10.0, gt=0, description="deadline of every unary call")
    reconnect_min_s: float = Field(0.5, gt=0)
    reconnect_max_s: float = Field(
        2.0, gt=0, description="longest wait between reconnects (at most the server's heartbeat interval)"
    )
    # Short enough that a stopping agent's workers are gone within 5 s of its SIGTERM; workers
    # keep nothing on SIGTERM (a preemption has its own, longer grace, before this one).
    kill_grace_s: float = Field(3.0, ge=0, description="SIGTERM to SIGKILL when stopping workers")
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
    profile_share_s: float = Field(
        900.0, ge=0, le=86400, description="take an alike agent's reference figures this fresh (0: measure)"
    )
    probe_staging: bool = Field(
        True,
        description=(
            "build a venv at start-up and fetch the control plane's store probe after registering;"
            " report what staging costs here"
        ),
    )
    cache_max_bytes: int = Field(
        100 * 1024**3, gt=0, description="node cache of staged blobs (LRU beyond it, blobs in use kept)"
    )
    pip_args: tuple[str, ...] = Field(
        (), max_length=32, description="extra pip install arguments (an index mirror, --no-index ...)"
    )
    pip_timeout_s: float = Field(1800.0, gt=0, le=86400, description="longest a venv build may take")
    checkpoint_retention_h: float = Field(
        24.0, ge=0, le=24 * 365, description="hours a job's checkpoints and run dirs outlive it here"
    )
    allow_command_override: bool = Field(
        False, description="honour a worker config's 'command' list instead of torchrun (tests only)"
    )
    allow_unsandboxed: bool = Field(
        False, description="run users' code without a sandbox where bubblewrap does not work here"
    )
    task_disk_gb: float = Field(
        100.0, gt=0, le=1e6, description="GiB a sandboxed task's own directories may hold"
    )
    task_tmp_gb: float = Field(
        4.0, gt=0, le=1024, description="GiB each of a sandboxed task's private /tmp and /dev/shm may hold"
    )
    backend: Literal["local", "slurm"] = Field(
        "local", description="where tasks run: this node (torchrun) or its cluster's Slurm (sbatch)"
    )
    slurm_partition: str = Field(
        "", max_length=200, description="Slurm partition for cpn's jobs ('': default)"
    )
    slurm_account: str = Field(
        "", max_length=200, description="Slurm account charged ('': the user's default)"
    )
    slurm_poll_s: float = Field(1.0, gt=0, le=300, description="how often a Slurm job's state is read")
    slurm_srun: bool = Field(False, description="run every task as an srun step, on one node too")
    slurm_gpu_memory_gb: float = Field(80.0, gt=0, le=4096, description="declared memory of a Slurm GPU")
    slurm_gpu_tflops: float = Field(100.0, gt=0, le=1e6, description="declared dense TFLOPS of a Slurm GPU")
    nccl_socket_ifname: str = Field(
        "", max_length=255, description="NCCL_SOCKET_IFNAME (and gloo's) for workers ('': NCCL's own choice)"
    )
    nccl_ib_hca: str = Field("", max_length=255, description="NCCL_IB_HCA for workers ('': every HCA)")
    nccl_timeout_s: float = Field(
        600.0, ge=10, le=86400, description="a collective waiting longer for a peer fails its task"
    )
    nccl_debug: Literal["", "WARN", "INFO"] = Field(
        "WARN",
        description="NCCL_DEBUG level, logged to files added to the task's log when a collective fails",
    )
    disk_check_interval_s: float = Field(
        2.0, gt=0, le=3600, description="how often a sandboxed task's disk use is checked"
    )

    @field_validator("server")
    @classmethod
    def _server(cls, v: str) -> str:
        return _addresses(v, "--server")

    @field_validator("enroll_server")
    @classmethod
    def _enroll_server(cls, v: str | None) -> str | None:
        return None if v is None else _addresses(v, "--enroll-server")

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

    @field_validator("nccl_socket_ifname", "nccl_ib_hca")
    @classmethod
    def _nccl_list(cls, v: str, info: ValidationInfo) -> str:
        pattern = IFNAME_RE if info.field_name == "nccl_socket_ifname" else IB_HCA_RE
        if v and not pattern.fullmatch(v):
            flag = "--nccl " + str(info.field_name).removeprefix("nccl_")
            raise ValueError(f"{flag}: expected NCCL's list syntax ([^=]name[,name...]), got {v!r}")
        return v

    @field_validator("nccl_debug", mode="before")
    @classmethod
    def _nccl_debug(cls, v: object) -> object:
        return v.upper() if isinstance(v, str) else v

    @field_validator("sync_ports", mode="before")
    @classmethod
    def _ports(cls, v: object) -> object:
        try:
            return parse_port_range(v) if isinstance(v, str) else v
        except InvalidArgument as exc:
            raise ValueError(exc.message) from None

    @field_validator("probe_port", "checkpoint_port")
    @classmethod
    def _port(cls, v: int, info: ValidationInfo) -> int:
        if v not in (-1, 0) and not 1024 <= v <= 65535:
            flag = "--" + str(info.field_name).replace("_", "-")
            raise ValueError(f"{flag}: -1 (none), 0 (any free port) or 1024..65535, got {v}")
        return v

    @model_validator(mode="after")
    def _backoff(self) -> AgentSettings:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")
        if self.enroll_server is not None and self.tls_ca_file is None:
            raise ValueError("--enroll-server (mTLS) needs --tls-ca-file")
        return self

    @property
    def enroll_servers(self) -> list[str]:
        return self.enroll_server.split(",") if self.enroll_server else []

    @property
    def node_key_file(self) -> Path:
        return self.work_dir / "node-key.pem"

    @property
    def node_cert_file(self) -> Path:
        return self.work_dir / "node-cert.pem"

    @property
    def servers(self) -> list[str]:
        """The control-plane replicas to try, in order."""
        return self.server.split(",")

    @property
    def effective_state_file(self) -> Path:
        return self.state_file or self.work_dir / "agent-state.json"
