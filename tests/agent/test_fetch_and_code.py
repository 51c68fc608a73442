"""Staging's parts against a real HTTP server on loopback: resumed downloads, digests, the node
cache and its eviction, code archives unpacked safely, venvs built once."""

from __future__ import annotations

import io
import os
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import code_env
from agent.fetch import BlobUse, FetchError, blobs_dir, evict, fetch
from tests.agent.fake_store import FakeStore, digest


@pytest.fixture
def store() -> Iterator[FakeStore]:
    s = FakeStore().start()
    yield s
    s.stop()


def test_a_dropped_connection_resumes_with_range_and_the_blob_is_whole(
    store: FakeStore, tmp_path: Path
) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    store.blobs["big"] = data
    store.drop_after["big"] = 1024 * 1024
    seen: list[tuple[int, int | None]] = []
    got = fetch(
        store.blob_url("big"),
        work_dir=tmp_path,
        digest=digest(data),
        expected_bytes=len(data),
        progress=lambda d, t: seen.append((d, t)),
    )
    assert got.path.read_bytes() == data
    assert (got.cache_hit, got.source, got.bytes, got.digest) == (False, "http", len(data), digest(data))
    gets = store.gets("big")
    assert len(gets) == 2 and gets[0].range is None
    assert gets[1].range is not None and gets[1].range.startswith("bytes=")
    resumed_at = int(gets[1].range.removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 1024 * 1024
    assert seen[-1] == (len(data), len(data))
    assert not (blobs_dir(tmp_path) / f"{digest(data)[7:]}.partial").exists()


def test_a_partial_left_by_an_earlier_agent_is_resumed_and_a_bad_one_restarted(
    store: FakeStore, tmp_path: Path
) -> None:
    data = os.urandom(50_000)
    store.blobs["b"] = data
    partial = blobs_dir(tmp_path) / f"{digest(data)[7:]}.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data[:20_000])
    got = fetch(store.blob_url("b"), work_dir=tmp_path, digest=digest(data))
    assert got.path.read_bytes() == data
    assert [r.range for r in store.gets("b")] == ["bytes=20000-"]
    # Longer than the blob: not a prefix of it; the server says 416 and it starts afresh.
    store.blobs["c"] = data[:1000]
    partial = blobs_dir(tmp_path) / f"{digest(data[:1000])[7:]}.partial"
    partial.write_bytes(b"x" * 5000)
    got = fetch(store.blob_url("c"), work_dir=tmp_path, digest=digest(data[:1000]))
    assert got.path.read_bytes() == data[:1000]
    assert [r.range for r in store.gets("c")] == ["bytes=5000-", None]


def test_a_digest_mismatch_deletes_the_bytes_and_fails(store: FakeStore, tmp_path: Path) -> None:
    store.blobs["x"] = b"the bytes that came"
    want = digest(b"the bytes that were promised")
    with pytest.raises(FetchError, match="digest mismatch") as failed:
        fetch(store.blob_url("x"), work_dir=tmp_path, digest=want)
    left = [p.name for p in blobs_dir(tmp_path).iterdir() if not p.name.endswith((".fetch", ".use"))]
    assert left == []
    assert "ticket" not in str(failed.value)  # the signed query never lands in a message


def test_a_cached_blob_is_used_without_a_request(store: FakeStore, tmp_path: Path) -> None:
    data = b"shard" * 1000
    store.blobs["s"] = data
    first = fetch(store.blob_url("s"), work_dir=tmp_path, digest=digest(data))
    n = len(store.requests)
    second = fetch(store.blob_url("s"), work_dir=tmp_path, digest=digest(data))
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert second.path == first.path and second.bytes == len(data)
    assert len(store.requests) == n


def test_more_bytes_than_announced_are_refused(store: FakeStore, tmp_path: Path) -> None:
    store.blobs["s"] = b"0123456789"
    with pytest.raises(FetchError, match="over the bound of 4"):
        fetch(store.blob_url("s"), work_dir=tmp_path, expected_bytes=4)


def test_a_refused_ticket_fails_at_once(store: FakeStore, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="HTTP 404"):
        fetch(store.blob_url("missing"), work_dir=tmp_path, digest=digest(b"x"))
    assert len(store.gets("missing")) == 1


def test_a_file_source_is_read_in_place(tmp_path: Path) -> None:
    src = tmp_path / "shard.bin"
    src.write_bytes(b"abc" * 100)
    got = fetch(f"file://{src}", work_dir=tmp_path / "work", digest=digest(src.read_bytes()))
    assert got.path == src and got.source == "file"
    assert not blobs_dir(tmp_path / "work").exists()
    with pytest.raises(FetchError, match="digest mismatch"):
        fetch(f"file://{src}", work_dir=tmp_path / "work", digest=digest(b"other"))


def test_eviction_drops_the_least_recently_used_blobs_not_in_use(store: FakeStore, tmp_path: Path) -> None:
    blobs = {name: os.urandom(1000) for name in ("a", "b", "c")}
    store.blobs.update(blobs)
    use = BlobUse()
    paths = {}
    for i, name in enumerate(("a", "b", "c")):
        paths[name] = fetch(
            store.blob_url(name),
            work_dir=tmp_path,
            digest=digest(blobs[name]),
            use=use if name == "a" else None,
        ).path
        os.utime(paths[name], (time.time() - 100 + i, time.time() - 100 + i))  # a oldest, c newest
    deleted = evict(tmp_path, max_bytes=2000)
    assert deleted == [paths["b"]]  # a is in use, so the next oldest goes
    assert paths["a"].exists() and paths["c"].exists()
    use.release()
    assert evict(tmp_path, max_bytes=1000) == [paths["a"]]


def _tar(entries: list[tarfile.TarInfo], files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in entries:
            tar.addfile(info)
    return buf.getvalue()


def _entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (_entry("../escape.py"), "'..'"),
        (_entry("/etc/evil.py"), "absolute"),
        (_entry("pkg/link", tarfile.SYMTYPE, "../../outside"), "link pointing outside"),
        (_entry("pkg/abs", tarfile.SYMTYPE, "/etc/passwd"), "link pointing outside"),
        (_entry("pkg/hard", tarfile.LNKTYPE, "../x"), "'..'|link pointing outside"),
        (_entry("dev", tarfile.CHRTYPE), "device file"),
        (_entry("fifo", tarfile.FIFOTYPE), "device file"),
    ],
)
def test_an_unsafe_archive_is_refused_and_nothing_is_unpacked(
    tmp_path: Path, entry: tarfile.TarInfo, why: str
) -> None:
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(_tar([entry], {"pkg/train.py": b"x = 1\n"}))
    with pytest.raises(code_env.CodeError, match=why):
        code_env.unpack_code(archive, digest(archive.read_bytes()), tmp_path / "work")
    assert list(code_env.code_root(tmp_path / "work").iterdir()) == []
    assert not (tmp_path / "escape.py").exists()


def test_a_safe_archive_is_unpacked_once(tmp_path: Path) -> None:
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(
        _tar([_entry("pkg/alias.py", tarfile.SYMTYPE, "train.py")], {"pkg/train.py": b"x = 1\n"})
    )
    d = digest(archive.read_bytes())
    first, hit1 = code_env.unpack_code(archive, d, tmp_path / "work")
    second, hit2 = code_env.unpack_code(archive, d, tmp_path / "work")
    assert (hit1, hit2) == (False, True) and first == second
    assert (first / "pkg" / "train.py").read_text() == "x = 1\n"
    assert (first / "pkg" / "alias.py").resolve() == (first / "pkg" / "train.py").resolve()


def test_an_archive_that_unpacks_too_big_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(_tar([], {"a.bin": b"\0" * 5000}))
    with tarfile.open(archive) as tar, pytest.raises(code_env.CodeError, match="more than 4096 bytes"):
        code_env.check_archive(tar, max_bytes=4096)


def test_two_tasks_with_the_same_requirements_build_one_venv(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("# nothing beyond the node's packages\n")
    req = digest((code / "requirements.txt").read_bytes())
    work = tmp_path / "work"
    results: list[code_env.Venv] = []
    args = ("--no-index", "--find-links", str(tmp_path / "empty"))
    threads = [
        threading.Thread(target=lambda: results.append(code_env.ensure_venv(code, req, work, pip_args=args)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(v.cache_hit for v in results) == [False, True]
    venv = results[0].path
    assert results[1].path == venv and (venv / code_env.VENV_DONE).exists()
    # The build's CPU seconds (python's venv and pip), from the kernel's accounting; none for the
    # task that found it built.
    assert sorted(v.cpu_s > 0 for v in results) == [False, True]
    assert code_env.complete_venvs(work) == [(pytest.approx(venv.stat().st_mtime), req)]
    # The venv runs over the node's packages: the node's torch, pinned against replacement.
    import subprocess

    out = subprocess.run(
        [str(code_env.venv_python(venv)), "-c", "import sys, torch; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(out.stdout.strip()) == venv
    assert (venv / "constraints.txt").read_text().startswith("torch==")


def test_requirements_that_do_not_match_their_digest_are_refused(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("numpy\n")
    with pytest.raises(code_env.CodeError, match="not stage.requirements_digest"):
        code_env.ensure_venv(code, digest(b"other"), tmp_path / "work")
    assert not code_env.venvs_root(tmp_path / "work").joinpath(digest(b"other")[7:]).exists()


def test_plain_http_reaches_only_a_control_plane_the_agent_itself_speaks_plaintext_to(tmp_path: Path) -> None:
    from agent.fetch import FetchError, fetch
    from agent.tls import plain_http_hosts

    assert plain_http_hosts("10.0.0.1:50051,[::1]:50051", None) == {"10.0.0.1", "::1"}
    assert plain_http_hosts("10.0.0.1:50051", tmp_path / "ca.pem") == frozenset()  # TLS: https only
    url = "http://10.0.0.1:8080/v1/artifacts/content/sha256:" + "a" * 64
    with pytest.raises(FetchError, match="plain http only to loopback"):
        fetch(url, work_dir=tmp_path, plain_http_hosts=plain_http_hosts("10.0.0.2:50051", None))


def test_a_build_step_over_its_time_or_cancelled_is_killed_and_said_so() -> None:
    from agent.fetch import Cancelled

    started = time.monotonic()
    with pytest.raises(code_env.PipFailed, match="still running after 0.3s"):
        code_env._run(["sleep", "30"], "pip install", 0.3, None, None)
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    with pytest.raises(Cancelled):
        code_env._run(["sleep", "30"], "pip install", 60.0, None, cancel)
    assert time.monotonic() - started < 10  # killed, not waited for
    # A run that ends reports the CPU seconds it used (a busy loop's, here).
    spin = "import time; t = time.process_time()\nwhile time.process_time() - t < 0.2: pass"
    assert code_env._run([sys.executable, "-c", spin], "python", 60.0, None, None) >= 0.2
