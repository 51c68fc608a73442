"""Link-probe tickets and bounds, shared by the control plane (which signs) and agents (which check).

A ticket lets one prober load one target's link with at most ``bulk_bytes`` and ``echoes`` round
trips until ``expires_at``. The target checks the MAC with its own probe key (issued at
registration, never sent to anyone else), so only the control plane can authorise a probe.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from dataclasses import dataclass

from contracts.errors import InvalidArgument, Unauthenticated

MAX_BULK_BYTES = 64 * 1024 * 1024  # a probe never moves more than this
MIN_BULK_BYTES = 64 * 1024
MAX_ECHOES = 32
CHUNK_BYTES = 64 * 1024  # bulk chunks; the target refuses bigger ones
MAX_TICKET_TTL_S = 600.0  # a ticket valid for longer than this is refused even with a good MAC


def new_probe_key() -> str:
    return secrets.token_hex(32)


@dataclass(frozen=True)
class Ticket:
    probe_id: str
    target_node_id: str
    bulk_bytes: int
    echoes: int
    expires_at: float  # unix seconds
    mac: str = ""

    def message(self) -> bytes:
        fields = (self.probe_id, self.target_node_id, self.bulk_bytes, self.echoes, repr(self.expires_at))
        return "|".join(str(f) for f in fields).encode()


def _mac(key: str, ticket: Ticket) -> str:
    return hmac.new(key.encode(), ticket.message(), hashlib.sha256).hexdigest()


def check_bounds(bulk_bytes: int, echoes: int) -> None:
    if not MIN_BULK_BYTES <= bulk_bytes <= MAX_BULK_BYTES:
        raise InvalidArgument(
            f"bulk_bytes: must be within {MIN_BULK_BYTES}..{MAX_BULK_BYTES}, got {bulk_bytes}",
            field="bulk_bytes",
        )
    if not 1 <= echoes <= MAX_ECHOES:
        raise InvalidArgument(f"echoes: must be within 1..{MAX_ECHOES}, got {echoes}", field="echoes")


def sign(key: str, ticket: Ticket) -> Ticket:
    check_bounds(ticket.bulk_bytes, ticket.echoes)
    return Ticket(
        ticket.probe_id,
        ticket.target_node_id,
        ticket.bulk_bytes,
        ticket.echoes,
        ticket.expires_at,
        _mac(key, ticket),
    )


def verify(key: str, node_id: str, ticket: Ticket, now: float) -> None:
    """Raise Unauthenticated unless ``ticket`` was signed with ``key`` for ``node_id`` and is current."""
    if not key or not ticket.mac or not hmac.compare_digest(_mac(key, ticket), ticket.mac):
        raise Unauthenticated("probe ticket is not valid for this node")
    if ticket.target_node_id != node_id:
        raise Unauthenticated("probe ticket names another node")
    if not math.isfinite(ticket.expires_at) or not now < ticket.expires_at <= now + MAX_TICKET_TTL_S:
        raise Unauthenticated("probe ticket has expired (or claims too long a life)")
    check_bounds(ticket.bulk_bytes, ticket.echoes)
