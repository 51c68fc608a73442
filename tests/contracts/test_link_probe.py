"""Probe tickets: only the holder of the target's key can make one, and it holds only as signed."""

from __future__ import annotations

import dataclasses

import pytest

from contracts.errors import InvalidArgument, Unauthenticated
from contracts.link_probe import MAX_BULK_BYTES, MAX_TICKET_TTL_S, Ticket, new_probe_key, sign, verify

NOW = 1_800_000_000.0


def ticket(**kw: object) -> Ticket:
    base = {
        "probe_id": "p1",
        "target_node_id": "n1",
        "bulk_bytes": 4 << 20,
        "echoes": 5,
        "expires_at": NOW + 60,
    }
    base.update(kw)
    return Ticket(**base)  # type: ignore[arg-type]


def test_a_signed_ticket_verifies_for_its_node_until_it_expires() -> None:
    key = new_probe_key()
    t = sign(key, ticket())
    verify(key, "n1", t, NOW)
    with pytest.raises(Unauthenticated, match="expired"):
        verify(key, "n1", t, NOW + 61)
    with pytest.raises(Unauthenticated):
        verify(key, "n2", t, NOW)  # another node's ticket


@pytest.mark.parametrize(
    "change", [{"bulk_bytes": 8 << 20}, {"echoes": 6}, {"expires_at": NOW + 120}, {"probe_id": "p2"}]
)
def test_any_changed_field_breaks_the_mac(change: dict[str, object]) -> None:
    key = new_probe_key()
    forged = dataclasses.replace(sign(key, ticket()), **change)
    with pytest.raises(Unauthenticated, match="not valid"):
        verify(key, "n1", forged, NOW)


def test_wrong_key_missing_mac_and_overlong_life_are_refused() -> None:
    key = new_probe_key()
    with pytest.raises(Unauthenticated):
        verify(new_probe_key(), "n1", sign(key, ticket()), NOW)
    with pytest.raises(Unauthenticated):
        verify(key, "n1", ticket(), NOW)
    with pytest.raises(Unauthenticated):
        verify("", "n1", sign(key, ticket()), NOW)
    with pytest.raises(Unauthenticated, match="too long"):
        verify(key, "n1", sign(key, ticket(expires_at=NOW + MAX_TICKET_TTL_S + 1)), NOW)


def test_bounds_are_enforced_when_signing() -> None:
    with pytest.raises(InvalidArgument, match="bulk_bytes"):
        sign(new_probe_key(), ticket(bulk_bytes=MAX_BULK_BYTES + 1))
    with pytest.raises(InvalidArgument, match="echoes"):
        sign(new_probe_key(), ticket(echoes=0))
