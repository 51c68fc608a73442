"""build_snapshot reads what is alive, free and priced from the database. The live snapshot is
the same builder kept current row by row (tests/control_layer/test_live_snapshot.py holds the
two paths equal); what a snapshot holds is decided, and tested, here."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.snapshot import build_snapshot
from orchestration.db.base import utcnow
from orchestration.db.engine import session_scope
from orchestration.db.models import Accelerator, Allocation, Cluster, Node, Price
from tests.orchestration.fleet import add_cluster, add_link, add_tenant, ensure_provider, hold_devices


def test_snapshot_reflects_liveness_allocations_prices_and_links(
    session_factory: sessionmaker[Session],
) -> None:
    with session_scope(session_factory) as s:
        tenant = add_tenant(s)
        eu, eu_nodes = add_cluster(s, region="eu-west", name="eu1", jurisdiction="EU", nodes=3, price=3.0)
        us, us_nodes = add_cluster(
            s, region="us-east", name="us1", jurisdiction="US", price=1.5, spot_price=0.5
        )
        add_link(s, "eu-west", "us-east", bandwidth_gbps=2.5, latency_ms=80, egress_price_per_gb=0.07)
        eu_nodes[1].status = "lost"
        eu_nodes[2].cordon = "draining"  # an operator's cordon: nothing new is placed there
        # what the node measured and declared travels with it
        eu_nodes[0].profile = {"startup_s": 2.0, "teardown_s": 0.5, "physical_cores": 4, "rates": {}}
        eu_nodes[0].cpu_contention, eu_nodes[0].cpu_contention_busy = 0.75, 1.0
        eu_nodes[0].fabric_bandwidth_gbps, eu_nodes[0].fabric_latency_ms = 10.0, 0.2
        eu_nodes[0].cross_cluster_host, eu_nodes[0].sandbox = "10.0.0.7", "bubblewrap"
        # device 0 of the first EU node is held; device 1 was held once and released
        hold_devices(s, tenant, eu_nodes[0], [0])
        released = hold_devices(s, tenant, eu_nodes[0], [1])
        s.execute(update(Allocation).where(Allocation.task_id == released.id).values(active=False))
        # price history: an older price, the one in force, and one that starts tomorrow
        s.add(Price(cluster_id=eu.id, price_per_device_hour=9.0, effective_from=utcnow() - timedelta(days=3)))
        s.add(Price(cluster_id=us.id, price_per_device_hour=7.0, effective_from=utcnow() + timedelta(days=1)))
        # a device not measured (yet) cannot be priced: left out
        s.execute(
            update(Accelerator)
            .where(Accelerator.node_id == us_nodes[0].id, Accelerator.index == 1)
            .values(measured_tflops=0.0)
        )
        # a cluster without a price cannot be planned on
        s.add(Cluster(name="unpriced", region="us-east", provider_id=ensure_provider(s, "acme").id))
        eu_id, us_id, n0 = eu.id, us.id, eu_nodes[0].id

    with session_scope(session_factory) as s:
        snap = build_snapshot(s)

    # plain data: it survives a JSON round trip unchanged
    assert ResourceSnapshot.from_json(snap.to_json()).model_dump() == snap.model_dump()
    assert [c.id for c in snap.clusters] == [eu_id, us_id]
    eu_info, us_info = snap.cluster(eu_id), snap.cluster(us_id)
    assert [n.id for n in eu_info.nodes] == [n0]  # the lost node and the cordoned one are gone
    mine = eu_info.nodes[0]
    assert mine.profile is not None and mine.profile.physical_cores == 4
    assert (mine.cpu_contention, mine.cpu_contention_busy) == (0.75, 1.0)
    assert (mine.fabric_bandwidth_gbps, mine.fabric_latency_ms) == (10.0, 0.2)
    assert mine.cross_cluster_groups and mine.sandbox == "bubblewrap"
    assert [d.index for d in us_info.nodes[0].devices] == [0]  # the unmeasured device is left out
    assert [(d.index, d.free) for d in eu_info.nodes[0].devices] == [(0, False), (1, True)]
    assert eu_info.n_free == 1 and us_info.n_free == 1
    assert eu_info.price_per_device_hour == 3.0  # newest in force, not the older one
    assert (us_info.price_per_device_hour, us_info.spot_price_per_device_hour) == (1.5, 0.5)  # not tomorrow's
    assert snap.jurisdiction("eu-west") == "EU" and snap.jurisdiction("us-east") == "US"
    link = snap.link("us-east", "eu-west")
    assert link is not None and (link.bandwidth_gbps, link.egress_price_per_gb) == (2.5, 0.07)

    with session_scope(session_factory) as s:
        assert [c.id for c in build_snapshot(s, exclude_nodes={n0}).clusters] == [us_id]
        s.execute(update(Node).values(status="drained"))
        assert build_snapshot(s).clusters == []
