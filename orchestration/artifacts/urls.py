"""Signed URLs for agents: each lets a node read one blob, or write one named output of one job,
through the control plane's REST API (``contracts.artifacts`` holds the ticket format)."""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import quote

from contracts.artifacts import ArtifactTicket, sign_ticket
from orchestration.settings import Settings

DEFAULT_TTL_S = 6 * 3600.0  # a task's staging, its run and its final upload


def artifact_key(settings: Settings) -> str:
    """The tickets' key, derived from the server's secret so every replica signs alike."""
    return hmac.new(settings.secret_key.encode(), b"cpn artifact tickets", hashlib.sha256).hexdigest()


def base_url(settings: Settings) -> str:
    """Where agents reach the REST API: the public URL, else the HTTP listener (https when it
    serves TLS: an agent that verifies the control plane fetches and uploads over https only)."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    host = "127.0.0.1" if settings.http_host in ("0.0.0.0", "::", "") else settings.http_host
    scheme = "https" if settings.tls_cert_file is not None else "http"
    return f"{scheme}://{host}:{settings.http_port}"


def get_url(
    settings: Settings, *, job_id: str, digest: str, max_bytes: int, now: float, ttl_s: float = DEFAULT_TTL_S
) -> str:
    ticket = sign_ticket(
        artifact_key(settings), ArtifactTicket("get", job_id, digest, max_bytes, now + ttl_s)
    )
    return f"{base_url(settings)}/v1/artifacts/content/{digest}?ticket={quote(ticket.encode())}"


def put_url(
    settings: Settings, *, job_id: str, name: str, max_bytes: int, now: float, ttl_s: float = DEFAULT_TTL_S
) -> str:
    ticket = sign_ticket(artifact_key(settings), ArtifactTicket("put", job_id, name, max_bytes, now + ttl_s))
    return f"{base_url(settings)}/v1/jobs/{job_id}/outputs/{name}?ticket={quote(ticket.encode())}"
