"""Process settings, read once per entry point from ``CPN_*`` environment variables and passed down."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_DEV_SECRET = "dev-insecure-secret"
DEFAULT_PLATFORM_FEE = 0.10  # the platform's share of device-time charges; providers are paid the rest


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CPN_", env_file=None, extra="ignore")

    environment: str = Field("development", description="development | production")
    data_dir: Path = Field(Path("./data"), description="Where the embedded SQLite file and run files live")
    database_url: str | None = Field(None, description="SQLAlchemy URL; unset = SQLite file in data_dir")
    redis_url: str | None = Field(None, description="redis://...; unset = in-process bus")
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 50051
    grpc_enroll_port: int = Field(
        50052, ge=0, le=65535, description="Enrollment port (server TLS only), opened under mTLS"
    )
    tls_cert_file: Path | None = Field(None, description="PEM certificate of REST and the agent port (TLS)")
    tls_key_file: Path | None = Field(None, description="PEM private key of tls_cert_file")
    tls_client_ca_file: Path | None = Field(
        None, description="Node CA: the agent port then requires client certificates it signed (mTLS)"
    )
    tls_client_ca_key_file: Path | None = Field(
        None, description="Node CA's key: nodes get their certificates at enrollment"
    )
    heartbeat_interval_s: float = Field(2.0, gt=0)
    heartbeat_misses: int = Field(3, ge=1, description="Missed heartbeats before a node is lost")
    queue_strategy: Literal["best_effort_fifo", "strict_fifo"] = Field(
        "best_effort_fifo",
        description="Head of line: best_effort_fifo passes over a job that does not fit now; "
        "strict_fifo lets the first job waiting for devices hold back every job behind it",
    )
    restart_grace_s: float | None = Field(
        None, gt=0, le=3600, description="How long a starting reaper declares no node lost (unset: derived)"
    )
    leader_lease_s: float = Field(
        5.0, ge=0.5, le=300, description="Silence after which a standby replica takes over the singletons"
    )
    replica_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}",
        min_length=1,
        max_length=200,
        description="This replica's name in the leader lease (default host:pid)",
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Server processes sharing the REST and gRPC ports (PostgreSQL only): about one per core",
    )
    reuse_port: bool = Field(
        False, description="Bind the ports with SO_REUSEPORT (set by `cpn server --workers` in its workers)"
    )
    max_job_retries: int = Field(2, ge=0)
    secret_key: str = Field(_DEV_SECRET, description="Signs dashboard sessions; required outside development")
    admin_api_key: str | None = Field(None, description="Bootstrap admin API key (created at start if set)")
    public_url: str | None = Field(None, description="URL shown to users for the dashboard")
    max_streams_per_tenant: int = Field(16, ge=1, le=10_000, description="Open event streams per tenant")
    max_body_bytes: int = Field(
        1 << 20, ge=1024, le=1 << 30, description="Largest request body accepted, checked before auth"
    )
    # Users' code and data (control_layer.user_data): where staging is priced from, what outputs may name.
    artifact_store_region: str | None = Field(
        None,
        max_length=64,
        description="Region the control plane (and its artifact store) serves from: the first guess of"
        " a node's staging bandwidth is its region's link to this one (unset: the node's own region)",
    )
    outputs_allow: list[str] = Field(
        default_factory=list,
        max_length=100,
        description="s3://bucket/prefix locations any tenant may name as outputs.uri, besides its own"
        " prefix of the store's bucket",
    )
    # Link probes (resource_layer/link_probes.py): agents measure the links between regions.
    link_probe_interval_s: float = Field(
        600.0, ge=1, le=86_400, description="Longest time between two probes of one link"
    )
    link_probe_budget: float = Field(
        0.01, gt=0, le=0.01, description="Share of a link's time probes may take (at most 1 %)"
    )
    link_probe_bytes: int = Field(
        4 * 1024 * 1024, ge=64 * 1024, le=64 * 1024 * 1024, description="Bulk transfer per probe"
    )
    link_probe_echoes: int = Field(
        5, ge=1, le=32, description="Round trips per probe (the lowest is the RTT)"
    )
    link_probe_timeout_s: float = Field(
        60.0, ge=5, le=600, description="A probe without a result by then failed"
    )
    link_probe_tick_s: float = Field(
        2.0, gt=0, le=60, description="How often the scheduler looks for due links"
    )
    link_fresh_s: float | None = Field(
        None,
        gt=0,
        le=30 * 86_400,
        description="Measurements younger than this feed the planner (unset: 3 intervals)",
    )

    # The ledger (orchestration/ledger/): what the platform keeps, and how often running tasks are billed.
    platform_fee: float = Field(
        DEFAULT_PLATFORM_FEE,
        ge=0,
        le=1,
        description="Platform's share of device-time charges (0.1 = 10 %), fixed per task at placement",
    )
    ledger_meter_interval_s: float = Field(
        60.0, ge=0.05, le=86_400, description="How often running tasks' device time and egress are charged"
    )

    # Workers' log lines (orchestration/logs, resource_layer/log_batcher.py).
    log_max_lines_per_task: int = Field(
        10_000, ge=10, le=1_000_000, description="Lines kept per task; the oldest are rotated out"
    )
    log_max_bytes_per_task: int = Field(
        2 * 1024 * 1024, ge=64 * 1024, le=256 * 1024 * 1024, description="Bytes of lines kept per task"
    )
    log_retention_days: float = Field(
        7.0, gt=0, le=3650, description="Lines of jobs that ended longer ago than this are deleted"
    )
    log_flush_s: float = Field(
        0.25, gt=0, le=10, description="How often received lines are written (one transaction each)"
    )
    log_max_pending_lines: int = Field(
        20_000, ge=100, le=1_000_000, description="Lines waiting to be written; beyond, they are dropped"
    )

    # The artifact store (orchestration/artifacts/): users' code, data, models and checkpoints.
    artifact_store: Literal["embedded", "s3"] = Field(
        "embedded", description="embedded: blobs under data_dir/artifacts; s3: an S3-compatible bucket"
    )
    s3_endpoint_url: str | None = Field(
        None, max_length=2048, description="S3-compatible endpoint (unset: AWS's own, by region)"
    )
    s3_bucket: str | None = Field(
        None, pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", description="Bucket of the s3 store"
    )
    s3_region: str | None = Field(None, max_length=64, description="Region of the bucket (unset: AWS_REGION)")
    s3_prefix: str = Field(
        "",
        max_length=512,
        pattern=r"^([A-Za-z0-9._-]+/)*$",
        description="Key prefix in the bucket, '' or 'a/b/'",
    )
    s3_access_key_id: str | None = Field(None, description="Unset: the standard AWS credential chain")
    s3_secret_access_key: str | None = Field(None, description="With s3_access_key_id")
    artifact_quota_bytes: int = Field(
        100 * 1024**3,
        ge=0,
        le=1 << 50,
        description="Bytes of artifacts a tenant may keep (default per tenant)",
    )
    artifact_retention_days: float = Field(
        30.0, gt=0, le=36_500, description="Artifacts are deleted this long after their last upload"
    )

    @model_validator(mode="after")
    def _refuse_default_secret(self) -> Settings:
        if self.environment != "development" and self.secret_key == _DEV_SECRET:
            raise ValueError("CPN_SECRET_KEY must be set when CPN_ENVIRONMENT is not 'development'")
        return self

    @model_validator(mode="after")
    def _tls_files_go_together(self) -> Settings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("CPN_TLS_CERT_FILE and CPN_TLS_KEY_FILE are set together or not at all")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("CPN_TLS_CLIENT_CA_FILE (mTLS) needs CPN_TLS_CERT_FILE and CPN_TLS_KEY_FILE")
        if self.tls_client_ca_key_file is not None and self.tls_client_ca_file is None:
            raise ValueError("CPN_TLS_CLIENT_CA_KEY_FILE needs CPN_TLS_CLIENT_CA_FILE")
        return self

    @model_validator(mode="after")
    def _s3_store_needs_a_bucket(self) -> Settings:
        if self.artifact_store == "s3" and not self.s3_bucket:
            raise ValueError("CPN_ARTIFACT_STORE=s3 needs CPN_S3_BUCKET")
        if (self.s3_access_key_id is None) != (self.s3_secret_access_key is None):
            raise ValueError(
                "CPN_S3_ACCESS_KEY_ID and CPN_S3_SECRET_ACCESS_KEY are set together or not at all"
            )
        if self.s3_endpoint_url is not None and not self.s3_endpoint_url.startswith(("http://", "https://")):
            raise ValueError("CPN_S3_ENDPOINT_URL must be an http:// or https:// URL")
        return self

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'cpn.sqlite').resolve()}"

    @property
    def effective_link_fresh_s(self) -> float:
        return self.link_fresh_s if self.link_fresh_s is not None else 3 * self.link_probe_interval_s

    @property
    def node_lost_after_s(self) -> float:
        return self.heartbeat_interval_s * self.heartbeat_misses

    @property
    def reaper_grace_s(self) -> float:
        """Twice the loss threshold plus two heartbeat intervals: agents retry at least once per
        interval, so each live one reconnects and heartbeats well within it after we start."""
        if self.restart_grace_s is not None:
            return self.restart_grace_s
        return 2 * self.node_lost_after_s + 2 * self.heartbeat_interval_s
