"""The agent's link probe between two nodes of a lab, without a control plane to order it.

    python -m benchmarks._mesh_probe serve HOST PORT NODE_ID KEY        # in the target's namespace
    python -m benchmarks._mesh_probe probe HOST PORT NODE_ID KEY BYTES  # in the source's namespace

``serve`` runs the agent's probe server (``agent.probe.build_probe_server``) as node NODE_ID
with probe key KEY until killed; ``probe`` signs a ticket with that key, as the control plane
does (``resource_layer.link_probes``), runs the agent's prober on it (``agent.probe.run_probe``)
and prints the result as JSON. The rate is what the control plane records from it:
timed bytes x 8 / the receiver's timed span.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid

from agent.probe import build_probe_server, run_probe
from contracts.lifetime import die_with_parent
from contracts.link_probe import Ticket, sign
from proto.cpn.agent.v1 import agent_pb2

ECHOES = 5  # the control plane's default (``link_probe_echoes``)


async def _serve(host: str, port: int, node_id: str, key: str) -> None:
    server, _ = build_probe_server(lambda: (node_id, key), host, port)
    await server.start()
    print("serving", flush=True)
    await server.wait_for_termination()


async def _probe(host: str, port: int, node_id: str, key: str, nbytes: int) -> dict[str, object]:
    t = sign(key, Ticket(uuid.uuid4().hex, node_id, nbytes, ECHOES, time.time() + 120))
    ticket = agent_pb2.LinkProbeTicket(
        probe_id=t.probe_id,
        target_node_id=t.target_node_id,
        bulk_bytes=t.bulk_bytes,
        echoes=t.echoes,
        expires_at=t.expires_at,
        mac=t.mac,
    )
    r = await run_probe(agent_pb2.LinkProbeOrder(ticket=ticket, target_host=host, target_port=port))
    out: dict[str, object] = {
        "rtt_ms": r.rtt_ms,
        "bulk_bytes": r.bulk_bytes,
        "bulk_s": r.bulk_s,
        "error": r.error,
    }
    if not r.error and r.bulk_s > 0:
        out["mbit"] = r.bulk_bytes * 8 / r.bulk_s / 1e6
    return out


def main(argv: list[str]) -> int:
    die_with_parent()
    if len(argv) < 5 or argv[0] not in ("serve", "probe"):
        print(__doc__, file=sys.stderr)
        return 2
    host, port, node_id, key = argv[1], int(argv[2]), argv[3], argv[4]
    if argv[0] == "serve":
        asyncio.run(_serve(host, port, node_id, key))
        return 0
    print(json.dumps(asyncio.run(_probe(host, port, node_id, key, int(argv[5])))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
