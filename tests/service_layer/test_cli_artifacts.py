"""``cpn artifacts``, ``cpn jobs submit --code`` and ``cpn jobs download`` against a live control plane."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from cpn.cli import app
from orchestration.artifacts.urls import put_url
from service_layer.client import CpnClient
from service_layer.code_archive import pack_code
from service_layer.server import ServerHandle
from service_layer.transfers import partial_path
from tests.service_layer.harness import new_tenant, seed_fleet, small_spec

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _cpn(server: ServerHandle, key: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app, list(args), env={"CPN_SERVER_URL": server.http_url, "CPN_API_KEY": key, "COLUMNS": "200"}
    )
    return result.exit_code, result.output


def _key(client: CpnClient) -> str:
    return client._headers["Authorization"][7:]


def test_submit_with_code_then_download_the_outputs(
    server: ServerHandle, admin: CpnClient, tmp_path: Path
) -> None:
    _, acme = new_tenant(admin, server, "acme")
    key = _key(acme)
    seed_fleet(server, admin)
    code = tmp_path / "code"
    (code / ".git").mkdir(parents=True)
    (code / ".git" / "HEAD").write_text("x")
    (code / "train.py").write_text("def build(cfg):\n    return cfg\n")
    (code / "requirements.txt").write_text("numpy\n")
    (code / "data.csv").write_text("1,2\n")
    spec = {**small_spec("byo", steps=10), "entrypoint": "train:build"}
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(spec))

    status, out = _cpn(
        server,
        key,
        "jobs",
        "submit",
        "-f",
        str(spec_file),
        "--code",
        str(code),
        "--exclude",
        "*.csv",
        "--json",
    )
    assert status == 0, out
    job = json.loads(out[out.index("{") :])
    expected = pack_code(code, tmp_path / "expected.tar.gz", exclude=["*.csv"])
    with acme:
        stored = acme.job(job["id"])["spec"]["code"]
        assert stored == {
            "digest": expected.digest,
            "requirements_digest": "sha256:" + hashlib.sha256(b"numpy\n").hexdigest(),
        }
        codes = acme.artifacts(kind="code")
        assert [(r["digest"], r["name"]) for r in codes] == [(expected.digest, "code.tar.gz")]
        # the same tree again: the same archive, nothing new stored
        status, out = _cpn(
            server, key, "jobs", "submit", "-f", str(spec_file), "--code", str(code), "--exclude", "*.csv"
        )
        assert status == 0, out
        assert [r["id"] for r in acme.artifacts(kind="code")] == [codes[0]["id"]]

        # a spec without an entrypoint cannot take code; a symlink out of the tree is refused
        plain = tmp_path / "plain.yaml"
        plain.write_text(yaml.safe_dump(small_spec("plain")))
        status, out = _cpn(server, key, "jobs", "submit", "-f", str(plain), "--code", str(code))
        assert status == 2 and "entrypoint" in out
        (code / "leak").symlink_to(tmp_path / "job.yaml")
        status, out = _cpn(server, key, "jobs", "submit", "-f", str(spec_file), "--code", str(code))
        assert status == 2 and "symlink pointing outside" in out
        assert len(acme.jobs()) == 2

        # the job's outputs, as the agent uploads them, then downloaded (one resumed)
        model = b"m" * 3_000_000
        with httpx.Client(base_url=server.http_url, timeout=30) as agent:
            for name, body in (("model.safetensors", model), ("config.json", b'{"d": 64}')):
                url = urlsplit(
                    put_url(
                        server.ctx.settings, job_id=job["id"], name=name, max_bytes=1 << 30, now=time.time()
                    )
                )
                assert agent.put(f"{url.path}?{url.query}", content=body).status_code == 201
        out_dir = tmp_path / "outputs"
        out_dir.mkdir()
        partial_path(out_dir / "model.safetensors").write_bytes(model[:1000])
        status, out = _cpn(server, key, "jobs", "download", job["id"], "-o", str(out_dir))
        assert status == 0, out
        assert (out_dir / "model.safetensors").read_bytes() == model
        assert (out_dir / "config.json").read_bytes() == b'{"d": 64}'
        assert sorted(p.name for p in out_dir.iterdir()) == ["config.json", "model.safetensors"]
        status, out = _cpn(server, key, "jobs", "download", job["id"], "-o", str(out_dir))
        assert status == 0 and out.count("up to date") == 2, out
        # a partial file that is not a prefix of the artifact fails the check and is not kept
        (out_dir / "model.safetensors").unlink()
        partial_path(out_dir / "model.safetensors").write_bytes(b"x" * 1000)
        status, out = _cpn(server, key, "jobs", "download", job["id"], "-o", str(out_dir))
        assert status == 1 and "downloaded bytes have" in out
        assert not (out_dir / "model.safetensors").exists()
        assert not partial_path(out_dir / "model.safetensors").exists()


def test_artifacts_upload_list_delete(server: ServerHandle, admin: CpnClient, tmp_path: Path) -> None:
    _, acme = new_tenant(admin, server, "acme")
    key = _key(acme)
    shard = tmp_path / "eu.bin"
    shard.write_bytes(b"\x01\x00" * 700_000)
    status, out = _cpn(server, key, "artifacts", "upload", str(shard), "--kind", "data", "--json")
    assert status == 0, out
    row = json.loads(out[out.index("{") :])
    assert row["uri"] == "artifact:sha256:" + hashlib.sha256(shard.read_bytes()).hexdigest()
    assert "eu.bin: " in out and "MiB" in out  # progress went to stderr (mixed in by the runner)
    status, out = _cpn(server, key, "artifacts", "list")
    assert status == 0 and row["id"] in out and "eu.bin" in out
    status, out = _cpn(server, key, "artifacts", "upload", str(shard), "--kind", "weights")
    assert status == 2
    status, out = _cpn(server, key, "artifacts", "delete", row["id"])
    assert status == 0 and row["id"] in out
    with acme:
        assert acme.artifacts() == []
