"""Migration 0029 adds a scheduler-backed node's unavailable devices and queue wait (0 for the
nodes already there), and its downgrade removes the columns leaving the nodes as they were."""

from __future__ import annotations

from sqlalchemy import inspect, text

from orchestration.db.engine import make_engine
from orchestration.db.migrate import downgrade, upgrade


def test_existing_nodes_start_with_none_unavailable_and_keep_their_rows_back_down(db_url: str) -> None:
    downgrade(db_url, "0028")
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
                    " intra_latency_ms, created_at) VALUES ('c', 'hpc', 'eu', 'p', 100, 0.01, '2026-11-01')"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO nodes (id, cluster_id, hostname, token_hash, advertise_host, sync_port_min,"
                    " sync_port_max, probe_port, probe_key, status, cordon, agent_version, registered_at,"
                    " sandbox) VALUES ('n', 'c', 'h', 'x', '127.0.0.1', 0, 0, 0, '', 'alive', '', '',"
                    " '2026-11-01', 'none')"
                )
            )
        upgrade(db_url, "0029")
        with engine.begin() as conn:
            row = conn.execute(
                text("SELECT devices_unavailable, queue_wait_s FROM nodes WHERE id = 'n'")
            ).one()
            assert tuple(row) == (0, 0.0)
            conn.execute(text("UPDATE nodes SET devices_unavailable = 5, queue_wait_s = 120 WHERE id = 'n'"))
        downgrade(db_url, "0028")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT id, hostname FROM nodes")).all() == [("n", "h")]
            columns = {c["name"] for c in inspect(conn).get_columns("nodes")}
            assert not columns & {"devices_unavailable", "queue_wait_s"}
    finally:
        engine.dispose()
    upgrade(db_url)
