"""The committed stubs are exactly what the committed .proto files generate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from proto.generate import ROOT, check, proto_files


def test_every_proto_is_found() -> None:
    names = {p.as_posix() for p in proto_files()}
    assert "proto/cpn/sync/v1/sync.proto" in names


def test_committed_stubs_match_regeneration() -> None:
    assert check() == []


def test_check_cli_fails_on_a_stale_stub(tmp_path: Path) -> None:
    # A copy of the tree with one stub altered: --check must notice and exit non-zero.
    import shutil

    shutil.copytree(ROOT / "proto", tmp_path / "proto")
    stub = tmp_path / "proto/cpn/sync/v1/sync_pb2.pyi"
    stub.write_text(stub.read_text() + "\n# edited\n")
    assert check(tmp_path) == ["proto/cpn/sync/v1/sync_pb2.pyi"]
    ok = subprocess.run(
        [sys.executable, "-m", "proto.generate", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_generated_imports_are_absolute() -> None:
    from proto.cpn.sync.v1 import sync_pb2_grpc

    text = Path(sync_pb2_grpc.__file__).read_text()
    assert "from proto.cpn.sync.v1 import sync_pb2" in text
