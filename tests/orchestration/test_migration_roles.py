"""Migration 0017 keeps what every existing key could do, and its downgrade gives none more."""

from __future__ import annotations

from alembic.script import ScriptDirectory
from sqlalchemy import text

from orchestration.db.engine import make_engine
from orchestration.db.migrate import alembic_config, downgrade, upgrade

ROLES = "0017"


def _before(db_url: str) -> str:
    revision = ScriptDirectory.from_config(alembic_config(db_url)).get_revision(ROLES)
    assert revision is not None and isinstance(revision.down_revision, str)
    return revision.down_revision


def test_existing_keys_keep_their_powers_both_ways(db_url: str) -> None:
    downgrade(db_url, _before(db_url))
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            for tid, name, platform in (("t-root", "admin", True), ("t-acme", "acme", False)):
                conn.execute(
                    text("INSERT INTO tenants (id, name, is_admin, created_at) VALUES (:i, :n, :a, :c)"),
                    {"i": tid, "n": name, "a": platform, "c": "2026-11-01 00:00:00"},
                )
            for kid, tid in (("k-root", "t-root"), ("k-acme", "t-acme")):
                conn.execute(
                    text(
                        "INSERT INTO api_keys (id, tenant_id, prefix, key_hash, created_at)"
                        " VALUES (:i, :t, :p, :h, :c)"
                    ),
                    {"i": kid, "t": tid, "p": kid, "h": "h-" + kid, "c": "2026-11-01 00:00:00"},
                )
        upgrade(db_url, ROLES)
        with engine.begin() as conn:
            roles = dict(conn.execute(text("SELECT id, role FROM api_keys")).all())
            assert roles == {"k-root": "admin", "k-acme": "tenant-admin"}
            # a member key of the platform tenant: older code would read it as admin
            conn.execute(
                text(
                    "INSERT INTO api_keys (id, tenant_id, prefix, key_hash, created_at, role, name)"
                    " VALUES ('k-ana', 't-root', 'k-ana', 'h-ana', '2026-11-02 00:00:00', 'member', 'ana')"
                )
            )
        downgrade(db_url, _before(db_url))
        with engine.connect() as conn:
            revoked = dict(conn.execute(text("SELECT id, revoked_at IS NOT NULL FROM api_keys")).all())
        assert {k: bool(v) for k, v in revoked.items()} == {"k-root": False, "k-acme": False, "k-ana": True}
    finally:
        engine.dispose()
    upgrade(db_url)
