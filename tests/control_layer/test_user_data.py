"""Reference checks of users' code, data and outputs (``control_layer.user_data``), pure: the
store's two seams are given as in-memory implementations of their protocols."""

from __future__ import annotations

import pytest

from contracts.errors import InvalidArgument
from control_layer.user_data import MemoryArtifacts, needs_resolution, resolve_refs
from tests.orchestration.fleet import tiny_spec

CODE = "sha256:" + "c" * 64


class BucketStore:
    """An ``S3Store`` over a dict of objects in one bucket, tenants' outputs under tenants/<id>/."""

    bucket = "cpn-store"

    def __init__(self, objects: dict[tuple[str, str], int]) -> None:
        self.objects = objects

    def tenant_prefix(self, tenant_id: str) -> str:
        return f"tenants/{tenant_id}/"

    def object_size(self, bucket: str, key: str) -> int | None:
        return self.objects.get((bucket, key))

    def presign_external(self, bucket: str, key: str) -> str:
        return f"https://s3.example.org/{bucket}/{key}?sig"


def _resolve(spec, *, s3=None, artifacts=None, allow=(), head=lambda url, t: None):
    return resolve_refs(
        spec, "t1", regions={"eu-west"}, artifacts=artifacts, s3=s3, output_allow=allow, head=head
    )


def _field(call) -> str:
    with pytest.raises(InvalidArgument) as got:
        call()
    return got.value.details["field"]


def test_outputs_only_under_the_tenants_prefix_or_the_allow_list() -> None:
    store = BucketStore({})

    def spec(uri: str):
        return tiny_spec(outputs={"uri": uri})

    assert needs_resolution(spec("s3://cpn-store/tenants/t1/run/"))
    _resolve(spec("s3://cpn-store/tenants/t1/run/"), s3=store)  # its own prefix
    assert _field(lambda: _resolve(spec("s3://cpn-store/tenants/t2/run/"), s3=store)) == "outputs.uri"
    assert _field(lambda: _resolve(spec("s3://cpn-store/tenants/t1x/"), s3=store)) == "outputs.uri"
    assert _field(lambda: _resolve(spec("s3://elsewhere/tenants/t1/"), s3=store)) == "outputs.uri"
    _resolve(spec("s3://elsewhere/shared/models/a"), s3=store, allow=["s3://elsewhere/shared"])
    assert (
        _field(lambda: _resolve(spec("s3://elsewhere/sharedx"), allow=["s3://elsewhere/shared"]))
        == "outputs.uri"
    )


def test_sizes_come_from_the_store_the_head_or_are_unknown() -> None:
    store = BucketStore({("data-bucket", "tokens.bin"): 77})
    s3_spec = tiny_spec(data={"kind": "tokens", "source": "s3://data-bucket/tokens.bin"})
    s3 = _resolve(s3_spec, s3=store)
    assert s3.source.bytes == 77 and s3.staging(s3_spec, "eu-west").source.bytes == 77
    missing = tiny_spec(data={"kind": "tokens", "source": "s3://data-bucket/nope.bin"})
    assert _field(lambda: _resolve(missing, s3=store)) == "data.source"
    web = _resolve(
        tiny_spec(data={"kind": "tokens", "source": "https://d.example.org/t.bin"}), head=lambda u, t: 5
    )
    assert web.source.bytes == 5
    local_spec = tiny_spec(data={"kind": "tokens", "source": "file:///data/t.bin"})
    local = _resolve(local_spec)
    assert local.source.bytes is None and local.staging(local_spec, None).source.bytes is None


def test_code_needs_an_artifact_store_and_the_tenants_own_upload() -> None:
    spec = tiny_spec(entrypoint="train:build", code={"digest": CODE})
    with pytest.raises(InvalidArgument, match="no artifact store"):
        _resolve(spec)
    store = MemoryArtifacts()
    store.add("t2", CODE, 10)  # another tenant's upload of the same bytes
    assert _field(lambda: _resolve(spec, artifacts=store)) == "code.digest"
    store.add("t1", CODE, 10)
    assert _resolve(spec, artifacts=store).code.bytes == 10
