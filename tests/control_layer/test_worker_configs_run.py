"""The worker configs placement writes are the ones real workers run: two torchrun groups on two
nodes of one region train a tiny model and sync with each other over loopback gRPC, with mutual
TLS on the job's own CA; a caller without the job's credentials is refused."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.workers import resolve_checkpoint_dir
from contracts.sync_config import SyncConfig
from control_layer.allocation import allocate
from control_layer.worker_config import job_sync_secret
from orchestration.db.engine import make_engine, make_session_factory, session_scope
from orchestration.db.migrate import upgrade
from orchestration.db.models import Job
from orchestration.sync_tls import leader_credentials
from proto.cpn.sync.v1 import sync_pb2
from tests.orchestration.fleet import add_cluster, add_tenant, hand_option, tiny_spec
from tests.processes import free_port
from training.sync.node import RegionNode
from training.sync.stats import TransferStats
from training.sync.tls import SyncTls
from training.sync.transport import PeerClient, PeerError
from training.wan.shaper import LinkShaper

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_same_region_tasks_train_and_sync(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cpn.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    spec = tiny_spec(
        data={"kind": "synthetic-markov", "seed": 1, "region": "eu-west"},
        sync={"mode": "diloco", "every": 2},
        training={"steps": 4, "global_batch_tokens": 64},
    )
    with session_scope(make_session_factory(engine)) as s:
        tenant = add_tenant(s)
        cluster, nodes = add_cluster(s, region="eu-west", name="c1", nodes=2, devices_per_node=1)
        for node in nodes:  # each node's declared sync range: one free port
            node.sync_port_min = node.sync_port_max = free_port()
        job = Job(tenant_id=tenant.id, name="j", spec=spec.model_dump(mode="json"))
        s.add(job)
        s.flush()
        option = hand_option([(cluster, nodes[0], 0), (cluster, nodes[1], 0)])
        # signed sync calls, as the placer configures every job
        tasks = allocate(s, job, spec, option, attempt=1, sync_secret=job_sync_secret("k", job.id))
        configs = [t.worker_config for t in tasks]
    engine.dispose()
    assert all(c["sync"]["auth_secret"] for c in configs)
    # each leader its own certificate, all of the job's one CA
    assert len({c["sync"]["tls_ca_pem"] for c in configs}) == 1
    assert len({c["sync"]["tls_cert_pem"] for c in configs}) == 2
    names = sorted(c["region"] for c in configs)
    assert all(n.startswith("eu-west/c1/") for n in names) and names[0] != names[1]

    procs = []
    for i, cfg in enumerate(configs):
        # as each node's agent does: checkpoints under its own work dir
        cfg = resolve_checkpoint_dir({**cfg, "device": "cpu"}, tmp_path / f"node{i}")
        path = tmp_path / f"worker{i}.json"
        path.write_text(json.dumps(cfg))
        cmd = [sys.executable, "-m", "training.launch", "--standalone", "--nproc-per-node", "1",
               "-m", "training.worker", "--config", str(path)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        procs.append(
            subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [p.communicate(timeout=240)[0] for p in procs]

    for cfg, out in zip(configs, outputs, strict=True):
        results = [
            json.loads(line.split(" ", 1)[1]) for line in out.splitlines() if line.startswith("CPN_RESULT ")
        ]
        assert results, f"worker for {cfg['region']} reported no result:\n{out[-3000:]}"
        result = results[-1]
        assert result["steps"] == 4 and math.isfinite(result["final_loss"]), result
        assert result["checkpoint_step"] == 4  # the final step is saved, in the node's work dir
        metrics = [
            json.loads(line.split(" ", 1)[1]) for line in out.splitlines() if line.startswith("CPN_METRIC ")
        ]
        received = [m.get("sync", {}).get("bytes_recv", {}) for m in metrics]
        peer = next(n for n in names if n != cfg["region"])
        assert any(r.get(peer, 0) > 0 for r in received), f"{cfg['region']} never heard from {peer}"

    # A leader's sync service as the runtime builds it from this config: the other leader's
    # credentials get through; plaintext, or another job's credentials with this job's secret, do not.
    first, second = configs
    node = RegionNode(
        SyncConfig.model_validate({**first["sync"], "listen": "127.0.0.1:0"}), first["region"], names
    )
    node.server.start()
    try:
        peer_tls = SyncTls(
            *(second["sync"][k].encode() for k in ("tls_ca_pem", "tls_cert_pem", "tls_key_pem"))
        )
        other = leader_credentials(job_sync_secret("k", "another-job"), "another-job", second["region"])
        outsiders = [
            None,
            SyncTls(*(other[k].encode() for k in ("tls_ca_pem", "tls_cert_pem", "tls_key_pem"))),
        ]
        for tls, refused in [(peer_tls, False), *((o, True) for o in outsiders)]:
            client = PeerClient(
                second["region"], first["region"], node.server.address, LinkShaper(), TransferStats(),
                auth_secret=second["sync"]["auth_secret"], tls=tls,
            )  # fmt: skip
            try:
                status = "OK"
                try:
                    client.hello(sync_pb2.HelloRequest(sender=second["region"]), timeout=10)
                except PeerError as e:
                    status = e.status
                assert (status == "UNAVAILABLE") == refused, (tls is peer_tls, status)
            finally:
                client.close()
    finally:
        node.server.stop()
