"""What ``cpn jobs submit`` uploads before it submits: the code directory (packed, see
``service_layer.code_archive``) and local data shards; each sets its field in the spec."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from service_layer.cli.artifacts import progress_line, size_text
from service_layer.cli.common import err_console, fail
from service_layer.client import CpnClient
from service_layer.code_archive import ArchiveError, check_archive, pack_code

SHARD_FLAGS = ("resident", "shared")


def attach_code(
    client: CpnClient, spec: dict[str, Any], code: Path, include: Sequence[str], exclude: Sequence[str]
) -> None:
    """Pack ``code`` (a directory, or a ready .tar.gz), upload it and set ``spec['code']``."""
    if not spec.get("entrypoint"):
        fail("--code needs an entrypoint in the spec ('module:function' inside the code)", code=2)
    with tempfile.TemporaryDirectory(prefix="cpn-code-") as tmp:
        try:
            if code.is_dir():
                packed = pack_code(code, Path(tmp) / "code.tar.gz", include=include, exclude=exclude)
            else:
                packed = check_archive(code)
        except ArchiveError as exc:
            fail(f"--code {code}: {exc}", code=2)
            raise AssertionError("unreachable") from None
        err_console.print(
            f"code: {packed.files} files, {size_text(packed.bytes)}, {packed.digest[:19]}…", markup=False
        )
        client.upload_artifact(
            packed.path,
            name=f"{code.name or 'code'}.tar.gz",
            kind="code",
            digest=packed.digest,
            progress=progress_line("code"),
        )
    spec["code"] = {"digest": packed.digest}
    if packed.requirements_digest:
        spec["code"]["requirements_digest"] = packed.requirements_digest


def parse_shard(text: str) -> tuple[str, str, bool]:
    """``REGION=FILE[:resident|:shared]`` -> (region, file or URI, resident). No flag: shared."""
    region, sep, rest = text.partition("=")
    if not sep or not region or not rest:
        raise ValueError(f"--shard {text!r}: expected REGION=FILE[:resident]")
    where, _, flag = rest.rpartition(":")
    if flag in SHARD_FLAGS and where:
        return region, where, flag == "resident"
    return region, rest, False


def attach_shards(client: CpnClient, spec: dict[str, Any], shards: Sequence[str]) -> None:
    """Upload each local shard file (a URI is taken as it is) and set ``spec['data']['shards']``."""
    data = spec.setdefault("data", {})
    out = data.setdefault("shards", {}) or {}
    for text in shards:
        try:
            region, where, resident = parse_shard(text)
        except ValueError as exc:
            fail(str(exc), code=2)
            raise AssertionError("unreachable") from None
        path = Path(where)
        if path.is_file():
            row = client.upload_artifact(path, kind="data", progress=progress_line(f"shard {region}"))
            out[region] = {"uri": row["uri"], "resident": resident}
        elif where.startswith(("artifact:", "s3://", "https://", "http://", "file://")):
            out[region] = {"uri": where, "resident": resident}
        else:
            fail(f"--shard {text!r}: {where} is neither a file nor a URI", code=2)
    data["shards"] = out
