"""Migration 0027 gives existing nodes an empty cordon reason and no device samples, existing
accelerators no UUID and no NVLink island, and its downgrade leaves the rows as they were."""

from __future__ import annotations

from sqlalchemy import inspect, text

from orchestration.db.engine import make_engine
from orchestration.db.migrate import downgrade, upgrade


def test_nodes_and_accelerators_keep_their_rows_both_ways(db_url: str) -> None:
    downgrade(db_url, "0026")
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
                    " sandbox) VALUES ('n', 'c', 'h', 'x', '127.0.0.1', 0, 0, 0, '', 'alive', 'cordoned', '',"
                    " '2026-11-01', 'bubblewrap')"
                )
            )
            conn.execute(
                text(
                    'INSERT INTO accelerators (id, node_id, "index", model, kind, memory_gb,'
                    " measured_tflops) VALUES ('a', 'n', 0, 'NVIDIA H100 80GB HBM3', 'cuda', 79.65, 650)"
                )
            )
        upgrade(db_url, "0027")
        with engine.begin() as conn:
            row = conn.execute(text("SELECT cordon, cordon_reason, device_samples FROM nodes")).one()
            assert tuple(row) == ("cordoned", "", None)  # an operator's cordon: no reason of the rules
            assert conn.execute(text("SELECT uuid, link_group FROM accelerators")).one() == ("", -1)
            conn.execute(text("UPDATE accelerators SET uuid = 'GPU-x', link_group = 0"))
        downgrade(db_url, "0026")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT id, cordon FROM nodes")).all() == [("n", "cordoned")]
            assert conn.execute(text("SELECT id, model FROM accelerators")).all() == [
                ("a", "NVIDIA H100 80GB HBM3")
            ]
            assert "cordon_reason" not in {c["name"] for c in inspect(conn).get_columns("nodes")}
            assert "link_group" not in {c["name"] for c in inspect(conn).get_columns("accelerators")}
    finally:
        engine.dispose()
    upgrade(db_url)
