"""HTTP client for the cpn REST API (used by the CLI and the demo). Every call has a timeout."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from service_layer import transfers

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
READ_ONLY = frozenset({"GET", "HEAD"})


class ApiError(Exception):
    """A non-2xx answer, with the server's ``{code, message, details}``."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.details = status, code, message, details or {}

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        try:
            body = response.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        return cls(
            response.status_code,
            str(body.get("code") or "http_error"),
            str(body.get("message") or response.text[:500] or response.reason_phrase),
            body.get("details") if isinstance(body.get("details"), dict) else {},
        )


def parse_sse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Server-sent events from text lines: ``{"event", "id", "data"}`` with ``data`` JSON-decoded."""
    event: str | None = None
    ident: str | None = None
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r")
        if not line:
            if data:
                text = "\n".join(data)
                try:
                    payload: Any = json.loads(text)
                except ValueError:
                    payload = text
                yield {"event": event or "message", "id": ident, "data": payload}
            event, ident, data = None, None, []
            continue
        if line.startswith(":"):
            continue  # comment (keep-alive)
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            ident = value


class CpnClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        # Several replicas: "https://a:8080,https://b:8080". A call that cannot connect to one
        # (nothing was sent, so even a POST is safe to repeat) goes to the next.
        self._urls = [u.strip().rstrip("/") for u in base_url.split(",") if u.strip()]
        if not self._urls:
            raise ValueError("no server URL given")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout, self._transport = timeout, transport
        self._use(0)

    def _use(self, index: int) -> None:
        self._index = index % len(self._urls)
        self.base_url = self._urls[self._index]
        self._http = httpx.Client(
            base_url=self.base_url, headers=self._headers, timeout=self._timeout, transport=self._transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CpnClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        for tried in range(len(self._urls)):
            try:
                response = self._request(method, path, **kwargs)
                break
            except httpx.ConnectError:
                if tried == len(self._urls) - 1:
                    raise
                self._http.close()
                self._use(self._index + 1)
        if response.status_code >= 400:
            raise ApiError.from_response(response)
        return response.json() if response.content else None

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except (httpx.ReadError, httpx.RemoteProtocolError):
            # A kept-alive connection the server closed as this request reached it (its idle timer
            # fired first on a stalled loop) is reset with nothing answered. A read changes nothing,
            # so it is asked once more on a new connection; a write is not repeated.
            if method not in READ_ONLY:
                raise
            return self._http.request(method, path, **kwargs)

    # -- users
    def quote(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/quotes", json=spec)

    def submit(
        self,
        *,
        spec: dict[str, Any] | None = None,
        choice: str = "cheapest",
        quote_id: str | None = None,
        option_id: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = (
            {"quote_id": quote_id, "option_id": option_id} if quote_id else {"spec": spec, "choice": choice}
        )
        return self._call("POST", "/v1/jobs", json=body)

    def jobs(self, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        return self._call("GET", "/v1/jobs", params=params)

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str, reason: str = "cancelled by user") -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel", json={"reason": reason})

    def preempt(
        self, job_id: str, reason: str, *, by_job_id: str | None = None, grace_s: float = 30.0
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"reason": reason, "grace_s": grace_s}
        if by_job_id:
            body["by_job_id"] = by_job_id
        return self._call("POST", f"/v1/jobs/{job_id}/preempt", json=body)

    def metrics(self, job_id: str, max_points: int = 500) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}/metrics", params={"max_points": max_points})

    def events(self, job_id: str, *, after: int = 0, follow: bool = True) -> Iterator[dict[str, Any]]:
        """The job's events as SSE; with ``follow`` until the job ends (the read has no timeout)."""
        timeout = httpx.Timeout(DEFAULT_TIMEOUT.connect or 5.0, read=None) if follow else DEFAULT_TIMEOUT
        params = {"after": after, "follow": str(follow).lower()}
        with self._http.stream(
            "GET", f"/v1/jobs/{job_id}/events", params=params, timeout=timeout
        ) as response:
            if response.status_code >= 400:
                response.read()
                raise ApiError.from_response(response)
            yield from parse_sse(response.iter_lines())

    def logs(
        self,
        job_id: str,
        *,
        task: str | None = None,
        tail: int | None = None,
        after: int = 0,
        limit: int = 1000,
    ) -> dict[str, Any]:
        """A page of the job's log lines: ``{lines, next_after, more, status}``."""
        params: dict[str, Any] = {"after": after, "limit": limit}
        if task:
            params["task"] = task
        if tail is not None:
            params["tail"] = tail
        return self._call("GET", f"/v1/jobs/{job_id}/logs", params=params)

    def follow_logs(
        self, job_id: str, *, task: str | None = None, tail: int | None = None, after: int = 0
    ) -> Iterator[dict[str, Any]]:
        """The job's log lines as SSE until the job ends (the read has no timeout)."""
        params: dict[str, Any] = {"after": after, "follow": "true"}
        if task:
            params["task"] = task
        if tail is not None:
            params["tail"] = tail
        timeout = httpx.Timeout(DEFAULT_TIMEOUT.connect or 5.0, read=None)
        with self._http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=timeout) as response:
            if response.status_code >= 400:
                response.read()
                raise ApiError.from_response(response)
            yield from parse_sse(response.iter_lines())

    # -- the artifact store
    def upload_artifact(
        self,
        path: Path,
        *,
        name: str | None = None,
        kind: str = "other",
        digest: str | None = None,
        progress: transfers.Progress | None = None,
    ) -> dict[str, Any]:
        """Stream a file up (read as it is sent). Its digest is computed first, so bytes the
        tenant already keeps are not sent again, and the server checks what it received."""
        digest = digest or transfers.file_digest(path)
        params = {"name": path.name if name is None else name, "kind": kind, "digest": digest}
        timeout = httpx.Timeout(DEFAULT_TIMEOUT.connect or 5.0, read=300.0, write=300.0)
        if any(r["job_id"] is None for r in self.artifacts(digest=digest, limit=1000)):
            # Known bytes: an empty body with the digest renews the artifact, nothing is sent again
            # (422 if the listing showed another tenant's, to an admin: then it is sent).
            try:
                return self._call("POST", "/v1/artifacts", params=params, content=b"", timeout=timeout)
            except ApiError as exc:
                if exc.status != 422:
                    raise
        headers = {"Content-Length": str(path.stat().st_size), "Content-Type": "application/octet-stream"}
        return self._call(
            "POST",
            "/v1/artifacts",
            params=params,
            content=transfers.read_chunks(path, progress),
            headers=headers,
            timeout=timeout,
        )

    def artifacts(
        self, kind: str | None = None, limit: int = 100, digest: str | None = None
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if kind:
            params["kind"] = kind
        if digest:
            params["digest"] = digest
        return self._call("GET", "/v1/artifacts", params=params)

    def job_artifacts(self, job_id: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/jobs/{job_id}/artifacts")

    def delete_artifact(self, artifact_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/artifacts/{artifact_id}")

    def download_artifact(
        self, artifact: dict[str, Any], dest: Path, progress: transfers.Progress | None = None
    ) -> Path:
        """Fetch ``artifact`` (a row from ``artifacts``/``job_artifacts``) to ``dest``: into
        ``dest.part`` first, resumed with ``Range`` where an earlier try stopped; kept only if
        its SHA-256 matches (``transfers.DigestMismatch`` otherwise)."""
        size, part = int(artifact["bytes"]), transfers.partial_path(dest)
        have = transfers.resume_from(part, size)
        if have < size or size == 0:
            headers = {"Range": f"bytes={have}-"} if have else {}
            timeout = httpx.Timeout(DEFAULT_TIMEOUT.connect or 5.0, read=300.0)
            with self._http.stream(
                "GET", f"/v1/artifacts/{artifact['id']}", headers=headers, timeout=timeout
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ApiError.from_response(response)
                have = have if response.status_code == 206 else 0
                with part.open("ab" if have else "wb") as out:
                    for chunk in response.iter_bytes(transfers.CHUNK_BYTES):
                        out.write(chunk)
                        have += len(chunk)
                        if progress:
                            progress(have, size)
        return transfers.finish(part, dest, artifact["digest"])

    def regions(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/regions")

    def clusters(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/clusters")

    def links(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/links")

    def healthz(self) -> dict[str, Any]:
        return self._call("GET", "/healthz")

    # -- the ledger
    def transactions(
        self, *, job_id: str | None = None, account: str | None = None, after: int = 0, limit: int = 100
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"after": after, "limit": limit}
        if job_id:
            params["job_id"] = job_id
        if account:
            params["account"] = account
        return self._call("GET", "/v1/ledger/transactions", params=params)

    def invoice(self, tenant_id: str, month: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/tenants/{tenant_id}/invoice", params={"month": month})

    def statement(self, provider: str, month: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/providers/{provider}/statement", params={"month": month})

    # -- admins
    def put_link(self, **link: Any) -> dict[str, Any]:
        return self._call("PUT", "/v1/links", json=link)

    def set_jurisdiction(self, region: str, jurisdiction: str, reason: str = "") -> dict[str, Any]:
        return self._call(
            "PUT", f"/v1/regions/{region}/jurisdiction", json={"jurisdiction": jurisdiction, "reason": reason}
        )

    def link_probes(self, limit: int = 100) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/links/probes", params={"limit": limit})

    def create_token(
        self, provider: str, note: str = "", ttl_s: float | None = 86_400.0, max_uses: int | None = 1
    ) -> dict[str, Any]:
        body = {"provider": provider, "note": note, "ttl_s": ttl_s, "max_uses": max_uses}
        return self._call("POST", "/v1/tokens", json=body)

    def create_tenant(self, name: str, is_admin: bool = False) -> dict[str, Any]:
        return self._call("POST", "/v1/tenants", json={"name": name, "is_admin": is_admin})

    def create_key(self, tenant_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/tenants/{tenant_id}/keys")

    def set_quota(
        self,
        tenant_id: str,
        *,
        max_devices: int | None,
        max_monthly_spend: float | None,
        max_artifact_bytes: int | None = None,
    ) -> dict[str, Any]:
        body = {
            "max_devices": max_devices,
            "max_monthly_spend": max_monthly_spend,
            "max_artifact_bytes": max_artifact_bytes,
        }
        return self._call("PUT", f"/v1/tenants/{tenant_id}/quota", json=body)

    def queue(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/queue")

    # -- keys, tokens, nodes (by role: tenant-admins, operators, admins)
    def keys(self, tenant_id: str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/keys", params={"tenant_id": tenant_id} if tenant_id else None)

    def add_key(self, role: str = "member", name: str = "", tenant_id: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"role": role, "name": name}
        if tenant_id:
            body["tenant_id"] = tenant_id
        return self._call("POST", "/v1/keys", json=body)

    def revoke_key(self, key_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/keys/{key_id}")

    def tokens(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/tokens")

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/tokens/{token_id}")

    def node_action(self, node_id: str, action: str, reason: str = "") -> dict[str, Any]:
        """``action``: cordon | uncordon | drain | revoke."""
        if action == "revoke":
            return self._call("DELETE", f"/v1/nodes/{node_id}", json={"reason": reason})
        return self._call("POST", f"/v1/nodes/{node_id}/{action}", json={"reason": reason})

    def snapshot(self) -> dict[str, Any]:
        return self._call("GET", "/v1/snapshot")

    def calibration(self, limit: int = 500) -> dict[str, Any]:
        return self._call("GET", "/v1/calibration", params={"limit": limit})
