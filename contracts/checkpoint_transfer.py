"""Checkpoint-transfer tickets and bounds, shared by the control plane (which signs) and agents.

A ticket lets one node fetch one complete checkpoint (``dir``/step_N) from the node named
``source_node_id``, moving at most ``max_bytes``, until ``expires_at``. The source checks the MAC
with its own probe key (issued at registration, known only to it and the control plane), so only
the control plane can make a node hand a job's checkpoint to another.

The copy itself runs over mutual TLS with the job's credentials (``CheckpointTls``: the job's CA,
as its cross-region sync has, and a certificate of it naming ``checkpoint_server_name``): the
weights never cross in plaintext, and only holders of the job's credentials take part.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from contracts.errors import InvalidArgument, Unauthenticated

MAX_CHECKPOINT_BYTES = 256 * 1024**3  # no single checkpoint copy moves more than this
MAX_FILES = 100_000
CHUNK_BYTES = 1024 * 1024
MAX_TICKET_TTL_S = 900.0
# Where checkpoints live under an agent's work dir (control_layer.worker_config.checkpoint_dir).
_DIR = re.compile(r"^checkpoints/[A-Za-z0-9._-]{1,128}/[A-Za-z0-9._-]{1,200}$")


MAX_PEM = 16 * 1024  # a certificate or key of any usual size, and no more


def checkpoint_server_name(job_id: str) -> str:
    """The name a job's checkpoint certificates carry (SAN DNS) and a fetch asks for (SNI): a source
    holding several jobs' checkpoints answers each with that job's certificate."""
    return f"{job_id}.ckpt.cpn"


def job_of_dir(dir_: str) -> str:
    """The job a checkpoint directory (``checkpoints/<job>/<participant>``) belongs to."""
    check_dir(dir_)
    return dir_.split("/")[1]


@dataclass(frozen=True)
class CheckpointTls:
    """One node's TLS material for one job's checkpoint copies (PEM): the job's CA, and a key with
    a certificate of that CA, which serves both ends of a copy."""

    ca_pem: str
    cert_pem: str
    key_pem: str

    @classmethod
    def from_dict(cls, d: object) -> CheckpointTls | None:
        """From a config's ``checkpoint.tls`` (or a stored copy); None unless complete and bounded."""
        if not isinstance(d, dict):
            return None
        got = [d.get(k) for k in ("ca_pem", "cert_pem", "key_pem")]
        if not all(isinstance(v, str) and 0 < len(v) <= MAX_PEM for v in got):
            return None
        return cls(*got)  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, str]:
        return {"ca_pem": self.ca_pem, "cert_pem": self.cert_pem, "key_pem": self.key_pem}


@dataclass(frozen=True)
class CheckpointTicket:
    transfer_id: str
    source_node_id: str
    dir: str
    step: int
    max_bytes: int
    expires_at: float  # unix seconds
    mac: str = ""

    def message(self) -> bytes:
        fields = (
            self.transfer_id,
            self.source_node_id,
            self.dir,
            self.step,
            self.max_bytes,
            repr(float(self.expires_at)),
        )
        return "|".join(str(f) for f in fields).encode()


def _mac(key: str, ticket: CheckpointTicket) -> str:
    return hmac.new(key.encode(), ticket.message(), hashlib.sha256).hexdigest()


def check_dir(dir_: str) -> None:
    """A checkpoint directory an agent may serve or write: ``checkpoints/<job>/<participant>``."""
    if not _DIR.match(dir_) or ".." in PurePosixPath(dir_).parts:
        raise InvalidArgument(f"dir: not a checkpoint directory: {dir_[:300]!r}", field="dir")


def check_bounds(ticket: CheckpointTicket) -> None:
    check_dir(ticket.dir)
    if not 0 < ticket.step < 2**62:
        raise InvalidArgument(f"step: must be positive, got {ticket.step}", field="step")
    if not 0 < ticket.max_bytes <= MAX_CHECKPOINT_BYTES:
        raise InvalidArgument(
            f"max_bytes: must be within 1..{MAX_CHECKPOINT_BYTES}, got {ticket.max_bytes}", field="max_bytes"
        )


def sign(key: str, ticket: CheckpointTicket) -> CheckpointTicket:
    check_bounds(ticket)
    return CheckpointTicket(
        ticket.transfer_id,
        ticket.source_node_id,
        ticket.dir,
        ticket.step,
        ticket.max_bytes,
        ticket.expires_at,
        _mac(key, ticket),
    )


def verify(key: str, node_id: str, ticket: CheckpointTicket, now: float) -> None:
    """Raise Unauthenticated unless ``ticket`` was signed with ``key`` for ``node_id`` and is current."""
    if not key or not ticket.mac or not hmac.compare_digest(_mac(key, ticket), ticket.mac):
        raise Unauthenticated("checkpoint ticket is not valid for this node")
    if ticket.source_node_id != node_id:
        raise Unauthenticated("checkpoint ticket names another node")
    if not math.isfinite(ticket.expires_at) or not now < ticket.expires_at <= now + MAX_TICKET_TTL_S:
        raise Unauthenticated("checkpoint ticket has expired (or claims too long a life)")
    check_bounds(ticket)


def check_manifest(files: list[tuple[str, int, str]], max_bytes: int) -> int:
    """Refuse a manifest a receiver must not write: paths that leave the step's directory, sizes
    out of bounds, malformed hashes. Returns the total size."""
    if not files or len(files) > MAX_FILES:
        raise InvalidArgument(f"manifest: 1..{MAX_FILES} files, got {len(files)}", field="manifest")
    seen: set[str] = set()
    total = 0
    for path, size, digest in files:
        p = PurePosixPath(path)
        if not path or p.is_absolute() or ".." in p.parts or "\\" in path or path in seen or len(path) > 1024:
            raise InvalidArgument(f"manifest: bad file path {path[:300]!r}", field="manifest")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise InvalidArgument(f"manifest: bad sha256 for {path!r}", field="manifest")
        if size < 0:
            raise InvalidArgument(f"manifest: negative size for {path!r}", field="manifest")
        seen.add(path)
        total += size
    if total > max_bytes:
        raise InvalidArgument(f"manifest: {total} bytes exceed the ticket's {max_bytes}", field="manifest")
    return total


def checkpoint_bytes_bound(n_params: int | None) -> int:
    """The most a checkpoint of ``n_params`` parameters may hold (fp32 weights and two Adam moments
    are 12 bytes a parameter; twice that plus 64 MiB leaves room for DCP's metadata and the run's
    state); the global cap without a parameter count (a bring-your-own model)."""
    if not n_params or n_params <= 0:
        return MAX_CHECKPOINT_BYTES
    return min(MAX_CHECKPOINT_BYTES, 24 * n_params + 64 * 1024 * 1024)
