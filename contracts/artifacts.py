"""Artifacts: content-addressed blobs (code archives, data shards, models, checkpoints) and the
tickets that let an agent read or write exactly the objects of its task.

Shared by the control plane (which stores blobs and signs tickets) and agents (which fetch and
upload with them). A ticket is an HMAC over what it allows, signed with the control plane's
artifact key; agents never hold the store's own credentials.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from contracts.errors import InvalidArgument, Unauthenticated

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
MAX_ARTIFACT_BYTES = 1 << 40  # one blob (a shard, a model) is at most 1 TiB
MAX_CODE_BYTES = 256 * 1024**2  # a packed code directory
MAX_TICKET_TTL_S = 24 * 3600.0  # a task's staging and its final upload fit in a day's ticket
ARTIFACT_SCHEME = "artifact"  # "artifact:sha256:<hex>": a blob this tenant uploaded
URI_SCHEMES = ("artifact", "s3", "https", "http", "file")
# Output file names: the leader writes the final model and its config into ``outputs_dir``; the
# agent uploads the newest complete checkpoint under CHECKPOINT_OUTPUT after a task that failed or
# was cancelled, where ``stage.outputs`` names it.
MODEL_OUTPUT = "model.safetensors"
MODEL_CONFIG_OUTPUT = "config.json"
CHECKPOINT_OUTPUT = "checkpoint.tar"
MAX_URI = 2048

ArtifactKind = Literal["code", "data", "model", "checkpoint", "other"]
TicketAction = Literal["get", "put"]


def check_digest(digest: str, field: str = "digest") -> str:
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise InvalidArgument(f"{field}: expected 'sha256:' and 64 lower-case hex digits", field=field)
    return digest


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class DataUri:
    """A parsed data or output location: ``artifact:sha256:...``, ``s3://bucket/key``,
    ``https://host/path`` (``http://`` only to loopback), ``file:///abs/path`` (on the node)."""

    scheme: str
    digest: str | None = None  # artifact
    bucket: str | None = None  # s3
    key: str | None = None  # s3
    url: str | None = None  # http(s)
    path: str | None = None  # file

    @property
    def text(self) -> str:
        match self.scheme:
            case "artifact":
                return f"artifact:{self.digest}"
            case "s3":
                return f"s3://{self.bucket}/{self.key or ''}"
            case "file":
                return f"file://{self.path}"
            case _:
                return self.url or ""


_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def parse_uri(uri: str, field: str = "uri") -> DataUri:
    """Parse and bound one location; raise InvalidArgument naming ``field``."""
    if not isinstance(uri, str) or not uri or len(uri) > MAX_URI or "\x00" in uri:
        raise InvalidArgument(f"{field}: a URI of 1 to {MAX_URI} characters without NUL", field=field)
    if uri.startswith("artifact:"):
        return DataUri("artifact", digest=check_digest(uri.removeprefix("artifact:"), field))
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "s3":
        key = parts.path.lstrip("/")
        if not _BUCKET.match(parts.netloc) or ".." in key.split("/"):
            raise InvalidArgument(f"{field}: expected s3://bucket/key, got {uri[:200]!r}", field=field)
        return DataUri("s3", bucket=parts.netloc, key=key)
    if scheme in ("https", "http"):
        if not parts.hostname:
            raise InvalidArgument(f"{field}: no host in {uri[:200]!r}", field=field)
        if scheme == "http" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise InvalidArgument(f"{field}: plain http only to loopback; use https", field=field)
        return DataUri(scheme, url=uri)
    if scheme == "file":
        if (
            parts.netloc not in ("", "localhost")
            or not parts.path.startswith("/")
            or ".." in parts.path.split("/")
        ):
            raise InvalidArgument(f"{field}: expected file:///absolute/path, got {uri[:200]!r}", field=field)
        return DataUri("file", path=parts.path)
    raise InvalidArgument(
        f"{field}: scheme must be one of {', '.join(URI_SCHEMES)}; got {uri[:200]!r}", field=field
    )


@dataclass(frozen=True)
class ArtifactTicket:
    """Lets the bearer ``get`` one blob (by digest) or ``put`` one named output of one job, of at
    most ``max_bytes``, until ``expires_at`` (unix seconds)."""

    action: TicketAction
    job_id: str
    target: str  # get: the digest; put: the output's name ("model.safetensors", ...)
    max_bytes: int
    expires_at: float
    mac: str = ""

    def message(self) -> bytes:
        fields = (self.action, self.job_id, self.target, self.max_bytes, repr(float(self.expires_at)))
        return "|".join(str(f) for f in fields).encode()

    def encode(self) -> str:
        """URL-safe text form (query parameter ``ticket``)."""
        return ".".join(
            (
                self.action,
                self.job_id,
                self.target,
                str(self.max_bytes),
                repr(float(self.expires_at)),
                self.mac,
            )
        )

    @classmethod
    def decode(cls, text: str) -> ArtifactTicket:
        parts = text.split(".") if isinstance(text, str) and len(text) <= 1024 else []
        # expires_at's repr holds one '.', the target may hold more (a file name): take both ends.
        if len(parts) < 7:
            raise Unauthenticated("artifact ticket is malformed")
        action, job_id = parts[0], parts[1]
        mac, exp_frac, exp_int, max_bytes = parts[-1], parts[-2], parts[-3], parts[-4]
        target = ".".join(parts[2:-4])
        try:
            return cls(action, job_id, target, int(max_bytes), float(f"{exp_int}.{exp_frac}"), mac)  # type: ignore[arg-type]
        except ValueError:
            raise Unauthenticated("artifact ticket is malformed") from None


_OUTPUT_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


def check_output_name(name: str) -> str:
    if not _OUTPUT_NAME.match(name or "") or ".." in name:
        raise InvalidArgument(
            f"output name must match {_OUTPUT_NAME.pattern}, got {name[:130]!r}", field="name"
        )
    return name


def _mac(key: str, ticket: ArtifactTicket) -> str:
    return hmac.new(key.encode(), ticket.message(), hashlib.sha256).hexdigest()


def sign_ticket(key: str, ticket: ArtifactTicket) -> ArtifactTicket:
    if ticket.action == "get":
        check_digest(ticket.target, "target")
    else:
        check_output_name(ticket.target)
    if not 0 < ticket.max_bytes <= MAX_ARTIFACT_BYTES:
        raise InvalidArgument(
            f"max_bytes: 1..{MAX_ARTIFACT_BYTES}, got {ticket.max_bytes}", field="max_bytes"
        )
    return ArtifactTicket(
        ticket.action, ticket.job_id, ticket.target, ticket.max_bytes, ticket.expires_at, _mac(key, ticket)
    )


def verify_ticket(key: str, ticket: ArtifactTicket, *, action: TicketAction, target: str, now: float) -> None:
    """Raise Unauthenticated unless ``ticket`` allows ``action`` on ``target`` now."""
    if not key or not ticket.mac or not hmac.compare_digest(_mac(key, ticket), ticket.mac):
        raise Unauthenticated("artifact ticket is not valid")
    if ticket.action != action or ticket.target != target:
        raise Unauthenticated(f"artifact ticket does not allow {action} of {target[:80]!r}")
    if not math.isfinite(ticket.expires_at) or not now < ticket.expires_at <= now + MAX_TICKET_TTL_S:
        raise Unauthenticated("artifact ticket has expired (or claims too long a life)")
