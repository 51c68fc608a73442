"""Regenerate the committed gRPC stubs of every ``proto/cpn/**/*.proto``.

    python -m proto.generate          # rewrite the stubs in place
    python -m proto.generate --check  # regenerate into a temp dir; exit 1 if a committed stub differs

Generation runs from the repository root with ``-I.`` so generated imports are absolute
(``proto.cpn.sync.v1.sync_pb2``).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files(root: Path = ROOT) -> list[Path]:
    return sorted(p.relative_to(root) for p in (root / "proto" / "cpn").rglob("*.proto"))


def generate(out_dir: Path, root: Path = ROOT) -> list[Path]:
    """Write the stubs of every proto under ``out_dir`` (mirroring the tree); returns their paths
    relative to ``out_dir``."""
    protos = proto_files(root)
    if not protos:
        raise SystemExit(f"no .proto files under {root / 'proto' / 'cpn'}")
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p) for p in protos),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    return [p.with_name(p.stem + s) for p in protos for s in SUFFIXES]


def check(root: Path = ROOT) -> list[str]:
    """Committed stubs that differ from a fresh generation (empty when up to date)."""
    with tempfile.TemporaryDirectory() as tmp:
        stale = []
        for rel in generate(Path(tmp), root):
            committed = root / rel
            if not committed.exists() or not filecmp.cmp(committed, Path(tmp) / rel, shallow=False):
                stale.append(str(rel))
        return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proto.generate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="fail if committed stubs are out of date")
    args = parser.parse_args(argv)
    if args.check:
        stale = check()
        if stale:
            print("stale generated stubs (run `python -m proto.generate`):\n  " + "\n  ".join(stale))
            return 1
        print(f"generated stubs up to date ({len(proto_files())} protos)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for rel in generate(Path(tmp)):
            shutil.copyfile(Path(tmp) / rel, ROOT / rel)
            print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
