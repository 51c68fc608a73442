"""The artifact store over REST: tenants' uploads and downloads, agents' tickets, quotas, roles."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from contracts.artifacts import ArtifactTicket, sign_ticket
from orchestration.artifacts.store import ArtifactStore
from orchestration.artifacts.urls import artifact_key, get_url, put_url
from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle, start_server_in_thread
from service_layer.transfers import partial_path
from tests.conftest import settings_for
from tests.s3_server import moto_s3
from tests.service_layer.harness import ADMIN_KEY, new_tenant, seed_fleet, small_spec

MIB = 1024 * 1024


def write_file(path: Path, size: int, seed: int = 0) -> Path:
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    with path.open("wb") as f:
        for start in range(0, size, len(block)):
            f.write(block[: min(len(block), size - start)])
    return path


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def blobs(server: ServerHandle) -> list[str]:
    return [b.digest for b in server.ctx.artifacts.blobs()]


class Recording(httpx.HTTPTransport):
    """The real transport, noting each request's Range header and answer's status."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str | None, int]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.seen.append((request.headers.get("range"), response.status_code))
        return response


class CountingStore:
    """The server's own store, noting the size of every write its uploads make."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store, self.writes = store, []

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def begin(self, max_bytes: int) -> object:
        writer, writes = self.store.begin(max_bytes), self.writes

        class Counted:
            def __getattr__(self, name: str) -> object:
                return getattr(writer, name)

            def write(self, data: bytes) -> None:
                writes.append(len(data))
                writer.write(data)

        return Counted()


def relative(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


def test_upload_list_download_resume_and_delete(
    server: ServerHandle, admin: CpnClient, tmp_path: Path
) -> None:
    _, acme = new_tenant(admin, server, "acme")
    _, rival = new_tenant(admin, server, "rival")
    src = write_file(tmp_path / "shard.bin", int(2.5 * MIB))  # over the 1 MiB body limit and a chunk
    data = src.read_bytes()
    counting = CountingStore(server.ctx.artifacts)
    server.ctx.artifact_store = counting  # type: ignore[assignment]
    with acme, rival:
        row = acme.upload_artifact(src, kind="data")
        # the body reached the store in pieces of about a chunk, never as a whole
        chunk = counting.store.chunk_bytes
        assert sum(counting.writes) == len(data) and len(counting.writes) >= 2
        assert max(counting.writes) < chunk + 256 * 1024
        assert (row["digest"], row["bytes"], row["kind"], row["name"]) == (
            sha(data),
            len(data),
            "data",
            "shard.bin",
        )
        assert row["uri"] == f"artifact:{sha(data)}" and row["job_id"] is None
        assert [r["id"] for r in acme.artifacts()] == [row["id"]] and rival.artifacts() == []
        again = acme.upload_artifact(src, kind="data")  # idempotent, with or without the digest
        assert again["id"] == row["id"] and again["expires_at"] >= row["expires_at"]
        raw = acme._http.post("/v1/artifacts", params={"name": "x"}, content=data)
        assert raw.status_code == 200 and raw.json()["id"] == row["id"]
        assert len(acme.artifacts()) == 1 and blobs(server) == [sha(data)]

        # ranges
        path = f"/v1/artifacts/{row['id']}"
        part = acme._http.get(path, headers={"Range": "bytes=100-199"})
        assert part.status_code == 206 and part.content == data[100:200]
        assert part.headers["content-range"] == f"bytes 100-199/{len(data)}"
        tail = acme._http.get(path, headers={"Range": "bytes=-10"})
        assert tail.status_code == 206 and tail.content == data[-10:]
        past = acme._http.get(path, headers={"Range": f"bytes={len(data)}-"})
        assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{len(data)}"
        assert acme._http.get(path).content == data
        assert rival._http.get(path).status_code == 404

        # a download that stopped half-way resumes from where it stopped
        dest = tmp_path / "out" / "shard.bin"
        dest.parent.mkdir()
        partial_path(dest).write_bytes(data[: MIB + 7])
        recording = Recording()
        with CpnClient(server.http_url, acme._headers["Authorization"][7:], transport=recording) as resuming:
            resuming.download_artifact(row, dest)
        assert recording.seen == [(f"bytes={MIB + 7}-", 206)]
        assert dest.read_bytes() == data and not partial_path(dest).exists()

        with pytest.raises(ApiError) as other:
            rival.delete_artifact(row["id"])
        assert other.value.status == 404
        assert acme.delete_artifact(row["id"])["id"] == row["id"]
        assert acme.artifacts() == [] and blobs(server) == []
        assert acme._http.get(path).status_code == 404


pytestmark_sqlite = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytestmark_sqlite
def test_a_digest_mismatch_is_422_and_stores_nothing(server: ServerHandle, admin: CpnClient) -> None:
    _, acme = new_tenant(admin, server, "acme")
    with acme:
        r = acme._http.post("/v1/artifacts", params={"digest": "sha256:" + "0" * 64}, content=b"x" * 5000)
        assert r.status_code == 422 and r.json()["details"]["field"] == "digest", r.text
        bad = acme._http.post("/v1/artifacts", params={"digest": "md5:abc"}, content=b"x")
        assert bad.status_code == 422 and "digest" in bad.text
        kind = acme._http.post("/v1/artifacts", params={"kind": "weights"}, content=b"x")
        assert kind.status_code == 422 and "kind" in kind.text
        assert acme.artifacts() == [] and blobs(server) == []


@pytest.fixture
def small_quota_server(tmp_path: Path) -> Iterator[ServerHandle]:
    from tests.dbtemplate import migrated_sqlite_url

    settings = settings_for(
        migrated_sqlite_url(tmp_path / "cpn.sqlite"),
        data_dir=tmp_path,
        http_port=0,
        grpc_port=0,
        admin_api_key=ADMIN_KEY,
        artifact_quota_bytes=100_000,
    )
    handle = start_server_in_thread(settings)
    yield handle
    handle.stop()


def test_the_quota_refuses_uploads_that_would_pass_it(small_quota_server: ServerHandle) -> None:
    server = small_quota_server
    with CpnClient(server.http_url, ADMIN_KEY) as admin:
        acme_row, acme = new_tenant(admin, server, "acme")
        with acme:
            first = acme._http.post("/v1/artifacts", content=b"a" * 60_000)
            assert first.status_code == 201
            declared = acme._http.post("/v1/artifacts", content=b"b" * 60_000)
            assert declared.status_code == 413, declared.text
            body = declared.json()
            assert body["code"] == "quota_exceeded"
            assert body["details"] == {"used_bytes": 60_000, "quota_bytes": 100_000, "needed_bytes": 60_000}

            def chunked() -> Iterator[bytes]:  # no Content-Length: refused as it passes the quota
                for _ in range(10):
                    yield b"c" * 10_000

            streamed = acme._http.post("/v1/artifacts", content=chunked())
            assert streamed.status_code == 413 and streamed.json()["code"] == "quota_exceeded"
            assert [r["bytes"] for r in acme.artifacts()] == [60_000]
            assert blobs(server) == [sha(b"a" * 60_000)]

            # a tenant's own quota overrides the server's default
            raised = admin.set_quota(
                acme_row["id"], max_devices=None, max_monthly_spend=None, max_artifact_bytes=200_000
            )
            assert raised["max_artifact_bytes"] == 200_000
            assert acme._http.post("/v1/artifacts", content=b"b" * 60_000).status_code == 201


def _job(server: ServerHandle, admin: CpnClient, client: CpnClient) -> str:
    seed_fleet(server, admin)
    return client.submit(spec=small_spec("with-outputs"))["id"]


@pytestmark_sqlite
def test_agents_write_outputs_and_read_blobs_with_tickets(
    server: ServerHandle, admin: CpnClient, tmp_path: Path
) -> None:
    _, acme = new_tenant(admin, server, "acme")
    _, rival = new_tenant(admin, server, "rival")
    settings = server.ctx.settings
    with acme, rival, httpx.Client(base_url=server.http_url, timeout=30) as agent:
        job_id = _job(server, admin, acme)
        model = write_file(tmp_path / "model.safetensors", 2 * MIB + 3).read_bytes()
        url = relative(
            put_url(settings, job_id=job_id, name="model.safetensors", max_bytes=10 * MIB, now=time.time())
        )
        put = agent.put(url, content=model)
        assert put.status_code == 201, put.text
        row = put.json()
        assert (row["kind"], row["job_id"], row["digest"], row["name"]) == (
            "model",
            job_id,
            sha(model),
            "model.safetensors",
        )
        retry = agent.put(url, content=model)  # the agent retries: the same record
        assert retry.status_code == 200 and retry.json()["id"] == row["id"]
        ckpt = relative(
            put_url(settings, job_id=job_id, name="checkpoint.pt", max_bytes=100, now=time.time())
        )
        assert agent.put(ckpt, content=b"state").json()["kind"] == "checkpoint"
        assert agent.put(ckpt, content=b"s" * 101).status_code == 413  # over the ticket's max_bytes

        def chunked() -> Iterator[bytes]:
            yield b"s" * 60
            yield b"s" * 60

        assert agent.put(ckpt, content=chunked()).status_code == 413
        listed = {r["name"]: r for r in acme.job_artifacts(job_id)}
        assert sorted(listed) == ["checkpoint.pt", "model.safetensors"]
        assert listed["checkpoint.pt"]["bytes"] == 5
        with pytest.raises(ApiError) as hidden:
            rival.job_artifacts(job_id)
        assert hidden.value.status == 404

        # reading by digest with a get ticket, Range included
        get = relative(
            get_url(settings, job_id=job_id, digest=sha(model), max_bytes=len(model), now=time.time())
        )
        assert agent.get(get).content == model
        ranged = agent.get(get, headers={"Range": "bytes=10-"})
        assert ranged.status_code == 206 and ranged.content == model[10:]

        # refused tickets: forged or expired -> 401; genuine but for something else -> 403
        key, now = artifact_key(settings), time.time()
        expired = sign_ticket(key, ArtifactTicket("get", job_id, sha(model), 100, now - 1))
        forged = sign_ticket("another-key", ArtifactTicket("get", job_id, sha(model), 100, now + 60))
        other_blob = sign_ticket(key, ArtifactTicket("get", job_id, sha(b"other"), 100, now + 60))
        put_ticket = sign_ticket(key, ArtifactTicket("put", job_id, "model.safetensors", 100, now + 60))
        content = f"/v1/artifacts/content/{sha(model)}"
        assert agent.get(content, params={"ticket": expired.encode()}).status_code == 401
        assert agent.get(content, params={"ticket": forged.encode()}).status_code == 401
        assert agent.get(content, params={"ticket": "nonsense"}).status_code == 401
        assert agent.get(content).status_code == 422  # no ticket at all
        assert agent.get(content, params={"ticket": other_blob.encode()}).status_code == 403
        assert agent.get(content, params={"ticket": put_ticket.encode()}).status_code == 403
        other_job = f"/v1/jobs/{'0' * 32}/outputs/model.safetensors"
        assert agent.put(other_job, params={"ticket": put_ticket.encode()}, content=b"x").status_code == 403
        other_name = f"/v1/jobs/{job_id}/outputs/config.json"
        assert agent.put(other_name, params={"ticket": put_ticket.encode()}, content=b"x").status_code == 403
        bad_name = f"/v1/jobs/{job_id}/outputs/..hidden"
        assert agent.put(bad_name, params={"ticket": put_ticket.encode()}, content=b"x").status_code == 422
        assert (
            agent.put(
                f"/v1/jobs/{job_id}/outputs/model.safetensors",
                params={"ticket": expired.encode()},
                content=b"x",
            ).status_code
            == 401
        )
        assert sorted(r["name"] for r in acme.job_artifacts(job_id)) == ["checkpoint.pt", "model.safetensors"]


@pytestmark_sqlite
def test_roles(server: ServerHandle, admin: CpnClient) -> None:
    platform = next(t for t in admin._call("GET", "/v1/tenants") if t["is_admin"])
    op_key = admin.add_key(role="operator", tenant_id=platform["id"])["key"]
    _, acme = new_tenant(admin, server, "acme")
    with acme, CpnClient(server.http_url, op_key) as operator:
        member = CpnClient(server.http_url, acme.add_key(name="ana")["key"])
        with member:
            row = member._call("POST", "/v1/artifacts", content=b"member's")
            assert [r["id"] for r in acme.artifacts()] == [row["id"]]  # the tenant's, not the key's
        assert operator._http.post("/v1/artifacts", content=b"x").status_code == 403
        assert operator._http.get("/v1/artifacts").status_code == 403
        assert operator._http.get(f"/v1/artifacts/{row['id']}").status_code == 403
        assert httpx.get(f"{server.http_url}/v1/artifacts").status_code == 401
        assert [r["id"] for r in admin.artifacts()] == [row["id"]]  # an admin sees every tenant's


def test_the_s3_store_behind_the_api(tmp_path: Path) -> None:
    from tests.dbtemplate import migrated_sqlite_url

    with moto_s3() as s3:
        settings = settings_for(
            migrated_sqlite_url(tmp_path / "cpn.sqlite"),
            data_dir=tmp_path,
            http_port=0,
            grpc_port=0,
            admin_api_key=ADMIN_KEY,
            **s3.settings(),
        )
        with start_server_in_thread(settings) as server, CpnClient(server.http_url, ADMIN_KEY) as admin:
            _, acme = new_tenant(admin, server, "acme")
            src = write_file(tmp_path / "big.bin", 9 * MIB)  # two parts
            data = src.read_bytes()
            with acme:
                row = acme.upload_artifact(src)
                keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=s3.bucket)["Contents"]]
                assert keys == [f"sha256/{row['digest'][7:9]}/{row['digest'][7:]}"]
                assert (
                    acme._http.get(f"/v1/artifacts/{row['id']}", headers={"Range": "bytes=5-9"}).content
                    == data[5:10]
                )
                job_id = "f" * 32
                get = relative(
                    get_url(settings, job_id=job_id, digest=row["digest"], max_bytes=1, now=time.time())
                )
                with httpx.Client(base_url=server.http_url, timeout=30) as agent:
                    redirect = agent.get(get)
                    assert redirect.status_code == 307
                    presigned = redirect.headers["location"]
                    assert presigned.startswith(s3.url)
                    assert httpx.get(presigned, headers={"Range": "bytes=0-3"}).content == data[:4]
                    assert agent.get(get, follow_redirects=True).content == data
                acme.delete_artifact(row["id"])
                assert s3.client().list_objects_v2(Bucket=s3.bucket).get("Contents", []) == []
