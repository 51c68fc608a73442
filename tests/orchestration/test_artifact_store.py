"""Both artifact store backends for real: a directory, and S3 (moto's server on loopback)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from contracts.errors import InvalidArgument, NotFound, PayloadTooLarge
from orchestration.artifacts.factory import make_store
from orchestration.artifacts.local import LocalStore
from orchestration.artifacts.s3 import S3Store
from orchestration.artifacts.store import ArtifactStore, put
from orchestration.settings import Settings
from tests.s3_server import S3Endpoint, moto_s3

CHUNK = 64 * 1024
PART = 5 * 1024 * 1024  # S3's smallest part


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Endpoint]:
    with moto_s3() as endpoint:
        yield endpoint


@pytest.fixture(params=["embedded", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    if request.param == "embedded":
        return LocalStore(tmp_path / "artifacts", chunk_bytes=CHUNK)
    endpoint: S3Endpoint = request.getfixturevalue("s3")
    prefix = f"t{tmp_path.name[-12:]}/".replace("_", "-")
    return S3Store(endpoint.client(), endpoint.bucket, prefix, chunk_bytes=CHUNK, part_bytes=PART)


def pattern(n: int, seed: int = 0) -> Iterator[bytes]:
    """``n`` bytes in 100 KiB pieces, made as they are asked for (never all at once)."""
    block = hashlib.sha256(str(seed).encode()).digest() * 3200  # 100 KiB
    sent = 0
    while sent < n:
        piece = block[: min(len(block), n - sent)]
        sent += len(piece)
        yield piece


def digest_of_stream(chunks: Iterator[bytes]) -> str:
    sha = hashlib.sha256()
    for c in chunks:
        sha.update(c)
    return "sha256:" + sha.hexdigest()


def test_a_blob_larger_than_a_part_streams_in_and_out_in_chunks(store: ArtifactStore) -> None:
    size = 2 * PART + 12345  # three parts on S3
    want = digest_of_stream(pattern(size))
    stored = put(store, pattern(size), expected_digest=want)
    assert (stored.digest, stored.bytes, stored.created) == (want, size, True)
    assert store.size(want) == size
    lengths, sha = [], hashlib.sha256()
    for chunk in store.open(want):
        lengths.append(len(chunk))
        sha.update(chunk)
    assert "sha256:" + sha.hexdigest() == want
    assert sum(lengths) == size and max(lengths) <= CHUNK and len(lengths) >= size // CHUNK
    # the same bytes again: kept once, reported as already there
    again = put(store, pattern(size))
    assert (again.digest, again.created) == (want, False)
    assert [b.digest for b in store.blobs()] == [want]


def test_ranges_read_exactly_the_bytes_asked_for(store: ArtifactStore) -> None:
    data = bytes(range(256)) * 1000
    stored = put(store, [data[:1000], data[1000:]])
    assert b"".join(store.open(stored.digest, 10, 19)) == data[10:20]
    assert b"".join(store.open(stored.digest, 200_000)) == data[200_000:]
    assert b"".join(store.open(stored.digest, len(data) - 1, len(data) - 1)) == data[-1:]


def test_a_digest_mismatch_stores_nothing(store: ArtifactStore) -> None:
    wrong = "sha256:" + "0" * 64
    with pytest.raises(InvalidArgument) as refused:
        put(store, pattern(PART + 10), expected_digest=wrong)
    assert refused.value.details["field"] == "digest"
    assert list(store.blobs()) == []
    assert store.stale_uploads(datetime.now(UTC) + timedelta(days=1)) == 0  # nothing left half-written


def test_a_stream_over_its_limit_is_refused_as_it_arrives(store: ArtifactStore) -> None:
    seen = []

    def counted() -> Iterator[bytes]:
        for piece in pattern(PART * 2):
            seen.append(len(piece))
            yield piece

    with pytest.raises(PayloadTooLarge):
        put(store, counted(), max_bytes=300_000)
    assert sum(seen) < 500_000  # stopped at the limit, not after reading everything
    assert list(store.blobs()) == []


def test_missing_blobs_and_deletes(store: ArtifactStore) -> None:
    stored = put(store, [b"hello"])
    absent = "sha256:" + "1" * 64
    assert store.size(absent) is None
    with pytest.raises(NotFound):
        list(store.open(absent))
    assert store.delete(stored.digest) is True
    assert store.delete(stored.digest) is False
    assert store.size(stored.digest) is None


def test_presigned_urls_serve_the_blob_on_s3_only(store: ArtifactStore) -> None:
    stored = put(store, [b"model bytes"])
    url = store.presign_get(stored.digest)
    if store.kind == "embedded":
        assert url is None and store.presign_external("bucket", "key") is None
        return
    assert url is not None
    assert httpx.get(url).content == b"model bytes"
    assert httpx.get(url, headers={"Range": "bytes=6-"}).content == b"bytes"


def test_the_settings_choose_the_backend(tmp_path: Path, s3: S3Endpoint) -> None:
    local = make_store(Settings(data_dir=tmp_path))
    assert isinstance(local, LocalStore) and local.root == tmp_path / "artifacts"
    remote = make_store(Settings(data_dir=tmp_path, **s3.settings()))  # type: ignore[arg-type]
    assert isinstance(remote, S3Store) and remote.bucket == s3.bucket
    stored = put(remote, [b"via settings"])
    assert remote.size(stored.digest) == len(b"via settings")
    with pytest.raises(ValueError, match="CPN_S3_BUCKET"):
        Settings(artifact_store="s3")
    with pytest.raises(ValueError, match="together"):
        Settings(s3_access_key_id="x")


def test_signed_urls_are_https_when_the_server_speaks_tls(tmp_path: Path) -> None:
    """Without a public URL the agents' URLs name the listener, in the scheme it speaks: an agent
    that verifies the control plane (``--tls-ca-file``) refuses plain http to it."""
    from orchestration.artifacts.urls import get_url
    from orchestration.settings import Settings

    plain = Settings(data_dir=tmp_path, http_port=8080)
    tls = Settings(
        data_dir=tmp_path, http_port=8443, tls_cert_file=tmp_path / "c", tls_key_file=tmp_path / "k"
    )
    kw = {"job_id": "j1", "digest": "sha256:" + "0" * 64, "max_bytes": 10, "now": 0.0}
    assert get_url(plain, **kw).startswith("http://127.0.0.1:8080/")
    assert get_url(tls, **kw).startswith("https://127.0.0.1:8443/")
