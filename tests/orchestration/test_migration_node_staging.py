"""Migration 0026 adds the nodes' staging figures and caches beside existing nodes, and its
downgrade removes them leaving the nodes (and what references them) as they were."""

from __future__ import annotations

from sqlalchemy import inspect, text

from orchestration.db.engine import make_engine
from orchestration.db.migrate import downgrade, upgrade

STAGING = "0026"


def test_nodes_keep_their_rows_both_ways(db_url: str) -> None:
    downgrade(db_url, "0025")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO regions (name, jurisdiction, created_at) VALUES ('eu', '', '2026-11-01')")
            )
            conn.execute(
                text("INSERT INTO providers (id, name, created_at) VALUES ('p', 'lumen', '2026-11-01')")
            )
            conn.execute(
                text(
                    "INSERT INTO clusters (id, name, region, provider_id, intra_bandwidth_gbps,"
                    " intra_latency_ms, created_at) VALUES ('c', 'paris', 'eu', 'p', 100, 0.01, '2026-11-01')"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO nodes (id, cluster_id, hostname, token_hash, advertise_host, sync_port_min,"
                    " sync_port_max, probe_port, probe_key, status, cordon, agent_version, registered_at,"
                    " sandbox) VALUES ('n', 'c', 'h', 'x', '127.0.0.1', 0, 0, 0, '', 'alive', '', '',"
                    " '2026-11-01', 'bubblewrap')"
                )
            )
        upgrade(db_url, STAGING)
        with engine.begin() as conn:
            assert conn.execute(text("SELECT staging_probe FROM nodes WHERE id = 'n'")).scalar() is None
            conn.execute(text("UPDATE nodes SET staging_probe = '{\"bytes_per_s\": 1.0}' WHERE id = 'n'"))
            conn.execute(
                text("INSERT INTO node_cache (node_id, kind, digest) VALUES ('n', 'blob', 'sha256:a')")
            )
        downgrade(db_url, "0025")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT id, sandbox FROM nodes")).all() == [("n", "bubblewrap")]
            assert "node_cache" not in inspect(conn).get_table_names()
            assert "staging_probe" not in {c["name"] for c in inspect(conn).get_columns("nodes")}
    finally:
        engine.dispose()
    upgrade(db_url)
