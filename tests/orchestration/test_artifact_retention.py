"""Quotas and retention: the pure decisions, and the sweep over a real database and store."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from contracts.errors import QuotaExceeded
from control_layer.reaper import sweep_artifacts_once
from orchestration.artifacts import policy, records
from orchestration.artifacts import probe as store_probe
from orchestration.artifacts.local import LocalStore
from orchestration.artifacts.store import BlobInfo, put
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Artifact, Tenant

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def test_quota_decisions() -> None:
    assert policy.quota_of(None, 500) == 500 and policy.quota_of(0, 500) == 0
    assert policy.upload_limit(used=400, quota=500) == 100
    assert policy.upload_limit(used=600, quota=500) == 0
    policy.check_quota(400, 500, 100)
    with pytest.raises(QuotaExceeded) as refused:
        policy.check_quota(400, 500, 101)
    assert refused.value.details == {"used_bytes": 400, "quota_bytes": 500, "needed_bytes": 101}
    assert policy.output_kind("checkpoint-step-40.pt") == "checkpoint"
    assert policy.output_kind("model.safetensors") == policy.output_kind("config.json") == "model"
    assert policy.expiry(NOW, 1.5) == NOW + timedelta(hours=36)


def test_orphans_are_unnamed_blobs_past_the_grace() -> None:
    old, fresh = NOW - policy.ORPHAN_GRACE - timedelta(seconds=1), NOW - timedelta(minutes=1)
    blobs = [
        BlobInfo("sha256:" + "a" * 64, 1, old),
        BlobInfo("sha256:" + "b" * 64, 1, old),
        BlobInfo("sha256:" + "c" * 64, 1, fresh),
    ]
    assert policy.orphans(blobs, {"sha256:" + "b" * 64}, NOW) == ["sha256:" + "a" * 64]


def _age(store: LocalStore, digest: str, by: timedelta) -> None:
    t = (datetime.now(UTC) - by).timestamp()
    os.utime(store.path(digest), (t, t))


def test_the_sweep_deletes_expired_rows_and_the_blobs_no_row_names(
    ctx: ServerContext, tmp_path: Path
) -> None:
    store = LocalStore(tmp_path / "artifacts")
    ctx.artifact_store = store
    now = datetime.now(UTC)
    kept, shared, gone, orphan, young = (put(store, [bytes([i]) * 100]) for i in range(5))
    for s in (kept, shared, gone, orphan):
        _age(store, s.digest, timedelta(days=40))
    with session_scope(ctx.session_factory) as session:
        session.add(Tenant(id="t1", name="t1"))
        session.flush()
        for stored, expires in (
            (kept, now + timedelta(days=1)),
            (shared, now - timedelta(days=1)),  # expired, but another row names the same bytes
            (shared, now + timedelta(days=1)),
            (gone, now - timedelta(seconds=1)),
        ):
            session.add(
                Artifact(tenant_id="t1", digest=stored.digest, bytes=100, kind="data", expires_at=expires)
            )
    # The store probe's blobs (orchestration.artifacts.probe): no row names them, the sweep keeps them.
    probe_blobs = store_probe.ensure(store, ctx.settings.link_probe_bytes)
    for b in probe_blobs:
        _age(store, b.digest, timedelta(days=40))
    stale = store.tmp / "up-crashed"
    stale.write_bytes(b"half")
    t = (now - timedelta(days=1)).timestamp()
    os.utime(stale, (t, t))

    swept = sweep_artifacts_once(ctx)
    assert (swept.rows, swept.blobs, swept.uploads) == (2, 2, 1)
    with ctx.session_factory() as session:
        left = sorted(session.scalars(select(Artifact.digest)))
        assert records.usage(session, "t1") == 200
    assert left == sorted([kept.digest, shared.digest])
    on_disk = {b.digest for b in store.blobs()}
    # young: an upload may be naming it now
    assert on_disk == {kept.digest, shared.digest, young.digest, *(b.digest for b in probe_blobs)}
    assert not stale.exists()
    assert sweep_artifacts_once(ctx) == records.Swept(0, 0, 0)  # idempotent
