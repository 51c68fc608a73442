"""Links in force: fresh measurements win, declared links are the fallback, each marked as such."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from resource_layer.link_view import DeclaredLink, Measurement, effective_links

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def m(src: str, dst: str, gbps: float, rtt: float, age_s: float) -> Measurement:
    return Measurement(src, dst, gbps, rtt, NOW - timedelta(seconds=age_s), "n1", "n2", 4 << 20)


def test_fresh_measurements_replace_declared_figures_but_keep_the_declared_price() -> None:
    declared = [DeclaredLink("eu", "us", 0.5, 40.0, 0.05, NOW - timedelta(days=3))]
    probes = [m("us", "eu", 0.09, 10.0, 30), m("us", "eu", 0.11, 12.0, 20), m("us", "eu", 5.0, 8.0, 10)]
    links = {(ln.src, ln.dst): ln for ln in effective_links(declared, probes, NOW, fresh_s=600)}
    back = links[("us", "eu")]
    assert back.source == "measured" and back.samples == 3
    assert back.bandwidth_gbps == 0.11  # the median: one odd probe does not move it
    assert back.latency_ms == 5.0  # half the median round trip
    assert back.egress_price_per_gb == 0.05  # the declared eu->us price serves both directions
    assert back.as_of == NOW - timedelta(seconds=10)
    fwd = links[("eu", "us")]
    assert fwd.source == "declared" and fwd.bandwidth_gbps == 0.5 and fwd.samples == 0


def test_a_stale_measurement_falls_back_to_the_declared_link_or_to_nothing() -> None:
    declared = [DeclaredLink("eu", "us", 0.5, 40.0, 0.0, NOW)]
    stale = [m("eu", "us", 0.1, 10.0, 700), m("ap", "eu", 0.2, 90.0, 700)]
    links = effective_links(declared, stale, NOW, fresh_s=600)
    assert [(ln.src, ln.dst, ln.source, ln.bandwidth_gbps) for ln in links] == [("eu", "us", "declared", 0.5)]


def test_a_link_is_private_only_where_every_declared_direction_says_so() -> None:
    """Privacy is a declaration (no probe sees it): a measured link takes it from the declared one
    (either direction); two declared directions must both say private; an undeclared one is public."""
    declared = [
        DeclaredLink("eu", "us", 0.5, 40.0, 0.0, NOW, private=True),
        DeclaredLink("eu", "ap", 0.5, 40.0, 0.0, NOW, private=True),
        DeclaredLink("ap", "eu", 0.5, 40.0, 0.0, NOW, private=False),
    ]
    probes = [m("us", "eu", 0.2, 10.0, 5), m("us", "ap", 0.2, 10.0, 5)]
    links = {(ln.src, ln.dst): ln.private for ln in effective_links(declared, probes, NOW, fresh_s=600)}
    assert links == {
        ("eu", "us"): True,
        ("us", "eu"): True,  # measured, private as eu->us was declared
        ("eu", "ap"): False,  # the way back is declared public
        ("ap", "eu"): False,
        ("us", "ap"): False,  # measured, never declared
    }
