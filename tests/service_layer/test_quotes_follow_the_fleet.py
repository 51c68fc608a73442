"""Quotes on a real server follow the fleet: what the planner keeps with the in-memory snapshot
(pool classes, link matrices, fixed seconds) never outlives a registration, a lost node or an
allocation, and an unchanged fleet is planned on the same snapshot object."""

from __future__ import annotations

from typing import Any

from control_layer.live_snapshot import LiveSnapshot
from control_layer.reactions import on_node_lost
from service_layer.client import CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import register_node, seed_fleet, small_spec, wait_placed


def _devices(quote: dict[str, Any]) -> set[tuple[str, str, int]]:
    return {(t["cluster"], t["node"], t["device"]) for o in quote["options"] for t in o["tasks"]}


def _clusters(quote: dict[str, Any]) -> set[str]:
    return {t["cluster"] for o in quote["options"] for t in o["tasks"]}


def test_quotes_follow_registrations_losses_and_allocations(server: ServerHandle, admin: CpnClient) -> None:
    seed_fleet(server, admin)  # paris-1 at 1.20 and stockholm-1 at 0.90 per device-hour, 2 CPU slots each
    live = server.ctx.live_snapshot
    assert isinstance(live, LiveSnapshot)
    spec = small_spec(steps=40)

    first = admin.quote(spec)
    snap = live.snapshot()
    again = admin.quote(spec)
    assert live.snapshot() is snap  # nothing changed: the same object, with what was derived from it
    assert [o["id"] for o in again["options"]] == [o["id"] for o in first["options"]]

    # A registration: a cheaper cluster joins and the next quote plans on it.
    token = admin.create_token("acme", note="joins later", max_uses=1)["token"]
    cheap = register_node(server, token, region="eu-north", cluster="stockholm-2", price=0.3)
    joined = admin.quote(spec)
    assert live.snapshot() is not snap
    assert cheap.cluster_id in _clusters(joined)
    cheapest = next(o for o in joined["options"] if o["label"] == "cheapest")
    assert cheap.cluster_id in {t["cluster"] for t in cheapest["tasks"]}

    # Its heartbeats stop and it is marked lost (the reaper's reaction): the fleet is the first
    # one again, and so are the options.
    on_node_lost(server.ctx, cheap.node_id, "missed heartbeats (test)")
    lost = admin.quote(spec)
    assert cheap.cluster_id not in _clusters(lost)
    assert [o["id"] for o in lost["options"]] == [o["id"] for o in first["options"]]

    # An allocation: a job placed on the cheapest option holds its devices; no later option uses them.
    option = next(o for o in lost["options"] if o["label"] == "cheapest")
    job = wait_placed(admin, admin.submit(quote_id=lost["id"], option_id=option["id"])["id"])
    assert job["status"] == "placed", job
    held = {(t["cluster"], t["node"], t["device"]) for t in option["tasks"]}
    after = admin.quote(spec)
    assert after["options"] and not (_devices(after) & held)
