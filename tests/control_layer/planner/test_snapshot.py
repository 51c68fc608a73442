"""The resource snapshot: JSON round trip, symmetric links, local defaults, free devices."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.errors import InvalidArgument
from control_layer.planner.snapshot import LOCAL_BANDWIDTH_GBPS, ResourceSnapshot

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "snapshot-3-regions.json"


def _snap(**extra) -> ResourceSnapshot:
    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "a", "jurisdiction": "EU"}, {"name": "b"}],
            "clusters": [
                {
                    "id": "c1",
                    "region": "a",
                    "price_per_device_hour": 1.0,
                    "nodes": [
                        {
                            "id": "n1",
                            "devices": [{"index": 0, "model": "cpu", "memory_gb": 4, "tflops": 0.05}],
                        },
                        {
                            "id": "n2",
                            "alive": False,
                            "devices": [{"index": 0, "model": "cpu", "memory_gb": 4, "tflops": 0.05}],
                        },
                    ],
                }
            ],
            "links": [
                {"src": "a", "dst": "b", "bandwidth_gbps": 10, "latency_ms": 50, "egress_price_per_gb": 0.05}
            ],
            **extra,
        }
    )


def test_example_round_trips_through_json() -> None:
    snap = ResourceSnapshot.from_json(EXAMPLE.read_text())
    again = ResourceSnapshot.from_json(snap.to_json())
    assert again == snap
    assert {r.name for r in snap.regions} == {"eu-west", "eu-central", "us-east"}


def test_one_direction_serves_both_and_same_region_is_local() -> None:
    snap = _snap()
    assert snap.link("a", "b").bandwidth_gbps == 10
    assert snap.link("b", "a").latency_ms == 50
    local = snap.link("a", "a")
    assert local.bandwidth_gbps == LOCAL_BANDWIDTH_GBPS and local.egress_price_per_gb == 0
    assert snap.link("a", "elsewhere") is None
    assert snap.jurisdiction("a") == "EU" and snap.jurisdiction("b") == ""


def test_explicit_reverse_direction_wins() -> None:
    snap = _snap(
        links=[
            {"src": "a", "dst": "b", "bandwidth_gbps": 10, "latency_ms": 50},
            {"src": "b", "dst": "a", "bandwidth_gbps": 2, "latency_ms": 60},
        ]
    )
    assert snap.link("a", "b").bandwidth_gbps == 10
    assert snap.link("b", "a").bandwidth_gbps == 2


def test_free_devices_skip_dead_nodes() -> None:
    c = _snap().clusters[0]
    assert [(n.id, d.index) for n, d in c.free_devices()] == [("n1", 0)]
    assert c.n_free == 1


def test_bad_snapshot_names_the_field() -> None:
    with pytest.raises(InvalidArgument) as err:
        ResourceSnapshot.from_json('{"clusters": [{"id": "c", "region": "a", "price_per_device_hour": -1}]}')
    assert "clusters.0.price_per_device_hour" in err.value.message


def test_duplicate_cluster_ids_are_refused() -> None:
    snap = _snap()
    twin = snap.clusters[0].model_dump()
    with pytest.raises(ValueError, match="duplicate cluster id"):
        ResourceSnapshot.model_validate({**snap.model_dump(), "clusters": [twin, twin]})


def test_indexes_kept_with_a_snapshot_are_its_own_and_not_a_copys() -> None:
    snap = ResourceSnapshot.model_validate(
        {"clusters": [{"id": "a", "region": "r", "price_per_device_hour": 1.0, "nodes": [{"id": "n0"}]}]}
    )
    assert list(snap.clusters_by_id()) == ["a"] and list(snap.nodes_by_id()) == ["n0"]
    emptied = snap.model_copy(update={"clusters": []})
    assert emptied.clusters_by_id() == {} and emptied.nodes_by_id() == {}
    assert list(snap.clusters_by_id()) == ["a"] and snap.cluster("a").id == "a"
