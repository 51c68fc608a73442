"""Per-stage sync: each pipeline stage's leader runs a sync engine of its own.

Where a job's replicas have their pipeline stages on different nodes, the leader of stage s (the
stage's first rank) meets the same stage of every other participant in a ring of its own
(``SyncConfig.stages``) and exchanges only that stage's parameters or gradients; the stages' rings
run side by side, each over its own nodes' links. Each engine is the ordinary ``SyncEngine`` with
the stage's addresses; this module derives its config and merges the engines' step metrics.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

from contracts.errors import FailedPrecondition
from contracts.sync_config import SyncConfig
from training.sync.stats import goodput_fraction


def stage_sync_config(sync: SyncConfig, stage: int, *, leads: bool) -> SyncConfig:
    """The config of stage ``stage``'s engine: its ring's addresses and order, a secret of its own
    (a call meant for another stage's ring is refused, not mixed into this one), and, for hand-run
    jobs, a rendezvous directory of its own. ``leads``: this rank is the stage's leader."""
    ring = next((r for r in sync.stages if r.stage == stage), None)
    if ring is None:
        raise FailedPrecondition(f"sync.stages lists no ring for pipeline stage {stage}", field="sync.stages")
    if leads and ring.listen is None and not sync.rendezvous_dir:
        raise FailedPrecondition(
            f"this node leads pipeline stage {stage} but sync.stages[{stage}].listen is not set",
            field="sync.stages",
        )
    secret = None
    if sync.auth_secret is not None:
        secret = hmac.new(
            bytes.fromhex(sync.auth_secret), f"stage:{stage}".encode(), hashlib.sha256
        ).hexdigest()
    fields = sync.model_dump() | {
        "listen": ring.listen,
        "advertise": ring.advertise,
        "peers": ring.peers,
        "ring_order": ring.ring_order,
        "hierarchy": ring.hierarchy,
        "auth_secret": secret,
        "rendezvous_dir": str(Path(sync.rendezvous_dir) / f"stage-{stage}") if sync.rendezvous_dir else None,
        "stages": [],
    }
    return SyncConfig.model_validate(fields)


def _sum_by_peer(parts: list[dict[str, Any]], key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in parts:
        for peer, n in (m.get(key) or {}).items():
            out[peer] = out.get(peer, 0) + n
    return out


def merge_stage_metrics(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One step's sync metrics from every stage's engine (stage order), as one participant's: bytes
    and transfers add up, the rings ran side by side so the step waited as long as the slowest
    (``blocked_s``), a peer is alive where every ring still has it."""
    parts = [m for m in parts if m]
    if not parts:
        return {}
    out = dict(parts[0])
    out["bytes_sent"] = _sum_by_peer(parts, "bytes_sent")
    out["bytes_recv"] = _sum_by_peer(parts, "bytes_recv")
    out["blocked_s"] = max(float(m.get("blocked_s", 0.0)) for m in parts)
    out["overlapped_s"] = max(float(m.get("overlapped_s", 0.0)) for m in parts)
    alive = [set(m.get("alive", ())) for m in parts]
    out["alive"] = sorted(set.intersection(*alive))
    wire = [m.get("wire_bytes_sent_total") for m in parts]
    out.pop("wire_bytes_sent_total", None)
    if all(w is not None for w in wire):  # a running total per engine's sockets: theirs added up
        out["wire_bytes_sent_total"] = sum(wire)  # type: ignore[arg-type]
    exchanges = sum(int(m.get("exchanges", 0)) for m in parts)
    if exchanges:
        out["exchanges"] = exchanges
        out["latency_s"] = (
            sum(float(m.get("latency_s", 0.0)) * int(m.get("exchanges", 0)) for m in parts) / exchanges
        )
    identical = [m["replicas_identical"] for m in parts if "replicas_identical" in m]
    if identical:
        out["replicas_identical"] = all(identical)
    transfers = [row for m in parts for row in m.get("transfers", ())]
    out.pop("goodput_fraction", None)
    if transfers:
        out["transfers"] = transfers
        g = goodput_fraction([(int(n), float(s), r) for n, s, r in transfers])
        if g is not None:
            out["goodput_fraction"] = g
    events = [e for m in parts for e in m.get("events", ())]
    if events:
        out["events"] = events
    if any("overlap_steps" in m for m in parts):
        out["overlap_steps"] = max(int(m.get("overlap_steps", 0)) for m in parts)
    out["stages"] = len(parts)
    return out


def merge_stage_totals(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's byte totals of every stage's engine, added up (keys present in every part)."""
    parts = [t for t in parts if t]
    if not parts:
        return {}
    keys = set.intersection(*(set(t) for t in parts))
    # Flags (``insecure``) hold where any stage's engine raised them; counts add up; lists (the
    # exchanges' spans) are every stage's, in time order.
    return {k: _merge_total([t[k] for t in parts]) for k in sorted(keys)}


def _merge_total(values: list[Any]) -> Any:
    if isinstance(values[0], bool):
        return any(values)
    if isinstance(values[0], list):
        return sorted(v for vs in values for v in vs)
    return sum(values)
