"""Links over REST: each marked measured or declared, with when and from what; probes for admins."""

from __future__ import annotations

import pytest

from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import measure_link, new_tenant, seed_fleet


def test_links_are_listed_measured_or_declared_and_probes_are_admin_only(
    server: ServerHandle, admin: CpnClient
) -> None:
    seed_fleet(server, admin)  # declares eu-west -> eu-north at 1 Gbit/s, 25 ms, $0.02/GB
    (declared,) = admin.links()
    assert declared["source"] == "declared" and declared["samples"] == 0
    assert declared["bandwidth_gbps"] == 1.0 and "declared" in declared["basis"] and declared["as_of"]

    probe_id = measure_link(server, "eu-north", "eu-west", rtt_ms=20.0)
    links = {(ln["src"], ln["dst"]): ln for ln in admin.links()}
    measured = links[("eu-north", "eu-west")]
    assert measured["source"] == "measured" and measured["samples"] == 1
    assert measured["bandwidth_gbps"] == pytest.approx(0.08) and measured["latency_ms"] == pytest.approx(10.0)
    assert measured["egress_price_per_gb"] == 0.02  # the declared price of the pair, either direction
    assert "probe" in measured["basis"] and measured["as_of"]
    assert links[("eu-west", "eu-north")]["source"] == "declared"  # the other direction: not measured
    snap = {(ln["src"], ln["dst"]): ln["source"] for ln in admin.snapshot()["links"]}
    assert snap == {("eu-north", "eu-west"): "measured", ("eu-west", "eu-north"): "declared"}

    (probe,) = admin.link_probes()
    assert probe["id"] == probe_id and probe["status"] == "ok" and probe["rtt_ms"] == 20.0
    assert probe["bandwidth_gbps"] == pytest.approx(0.08) and probe["duration_s"] == 0.6
    for bad in (0, 501):
        with pytest.raises(ApiError) as err:
            admin.link_probes(limit=bad)
        assert err.value.status == 422 and "limit" in str(err.value.details)
    _, tenant = new_tenant(admin, server, "viewer")
    with tenant:
        assert {ln["source"] for ln in tenant.links()} == {"measured", "declared"}
        with pytest.raises(ApiError) as denied:
            tenant.link_probes()
        assert denied.value.status == 403
