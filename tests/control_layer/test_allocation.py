"""Allocation of hand-written plan options: locks, conflicts, sync ports and worker configs."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from contracts.errors import FailedPrecondition
from contracts.worker_config import parse_worker_config
from control_layer.allocation import AllocationConflict, allocate, release
from orchestration.db.engine import session_scope
from orchestration.db.models import Allocation, Job, Node
from tests.orchestration.fleet import add_cluster, add_link, add_tenant, hand_option, tiny_spec


def _job(s: Session) -> Job:
    tenant = add_tenant(s, name=f"t{s.info.setdefault('n', 0)}")
    s.info["n"] += 1
    job = Job(tenant_id=tenant.id, name="j", spec=tiny_spec().model_dump(mode="json"))
    s.add(job)
    s.flush()
    return job


def test_two_region_option_gets_ports_peers_and_replica_offsets(
    session_factory: sessionmaker[Session],
) -> None:
    with session_scope(session_factory) as s:
        eu, (eu_node,) = add_cluster(s, region="eu-west", name="eu1", price=3.0, sync_ports=(21000, 21001))
        us, (us_node,) = add_cluster(
            s, region="us-east", name="us1", price=1.0, spot_price=0.4, advertise_host="10.0.0.2"
        )
        add_link(s, "eu-west", "us-east", egress_price_per_gb=0.08)
        option = hand_option([(eu, eu_node, 0), (eu, eu_node, 1), (us, us_node, 1), (us, us_node, 0)])
        job = _job(s)
        tasks = allocate(s, job, tiny_spec(), option, attempt=1)
        by_region = {t.region: t for t in tasks}
        eu_task, us_task = by_region["eu-west"], by_region["us-east"]

        assert eu_task.device_indices == [0, 1] and us_task.device_indices == [1, 0]  # rank order
        assert (eu_task.sync_port, us_task.sync_port) == (21000, 20000)
        assert (eu_task.price_per_device_hour, us_task.price_per_device_hour) == (3.0, 1.0)
        assert eu_task.egress_price_per_gb == us_task.egress_price_per_gb == 0.08
        eu_cfg, us_cfg = eu_task.worker_config, us_task.worker_config
        assert eu_cfg["sync"]["listen"] == "127.0.0.1:21000"
        assert eu_cfg["sync"]["peers"] == {"us-east": "10.0.0.2:20000"}
        assert us_cfg["sync"]["peers"] == {"eu-west": "127.0.0.1:21000"}
        assert [eu_cfg["sync"]["replica_offset"], us_cfg["sync"]["replica_offset"]] == [0, 2]
        assert eu_cfg["sync"]["global_replicas"] == 4 and eu_cfg["parallel"]["dp_local"] == 2
        assert eu_cfg["training"]["global_batch"] == 4  # 64 tokens / 16 per sequence, over all replicas
        assert (eu_cfg["sync"]["mode"], eu_cfg["sync"]["every"]) == ("diloco", 2)
        assert (eu_cfg["sync"]["region"], us_cfg["sync"]["advertise"]) == ("eu-west", "10.0.0.2:20000")
        assert eu_cfg["sync"]["outer_lr"] == 0.7  # DiLoCo's outer optimizer
        for cfg in (eu_cfg, us_cfg):
            parsed = parse_worker_config(cfg)  # the worker's own schema accepts it
            assert parsed.local_batch == 1

        # the same devices again: refused, whatever the caller's snapshot said
        with pytest.raises(AllocationConflict, match="already allocated"):
            allocate(s, _job(s), tiny_spec(), hand_option([(us, us_node, 0)], option_id="again"), attempt=1)


def test_second_job_on_a_node_gets_the_next_port_and_released_ports_return(
    session_factory: sessionmaker[Session],
) -> None:
    with session_scope(session_factory) as s:
        eu, (n1,) = add_cluster(s, region="eu-west", devices_per_node=4, sync_ports=(22000, 22001))
        us, (n2,) = add_cluster(s, region="us-east", devices_per_node=4)
        first = allocate(s, _job(s), tiny_spec(), hand_option([(eu, n1, 0), (us, n2, 0)]), attempt=1)
        second = allocate(s, _job(s), tiny_spec(), hand_option([(eu, n1, 1), (us, n2, 1)]), attempt=1)
        assert {t.sync_port for t in first if t.node_id == n1.id} == {22000}
        assert {t.sync_port for t in second if t.node_id == n1.id} == {22001}
        with pytest.raises(AllocationConflict, match="sync ports 22000-22001 are in use"):
            allocate(s, _job(s), tiny_spec(), hand_option([(eu, n1, 2), (us, n2, 2)]), attempt=1)
        for t in first:
            t.status = "failed"
        release(s, first[0].job_id)
        third = allocate(s, _job(s), tiny_spec(), hand_option([(eu, n1, 0), (us, n2, 0)]), attempt=1)
        assert {t.sync_port for t in third if t.node_id == n1.id} == {22000}


def test_stale_options_conflict(session_factory: sessionmaker[Session]) -> None:
    with session_scope(session_factory) as s:
        c, (node, other) = add_cluster(s, nodes=2)
        s.get(Node, other.id).status = "lost"  # type: ignore[union-attr]
        with pytest.raises(AllocationConflict, match="is lost"):
            allocate(s, _job(s), tiny_spec(), hand_option([(c, other, 0)]), attempt=1)
        with pytest.raises(AllocationConflict, match="no device 7"):
            allocate(s, _job(s), tiny_spec(), hand_option([(c, node, 7)]), attempt=1)


def test_single_node_job_needs_no_sync_port_and_multi_node_needs_one(
    session_factory: sessionmaker[Session],
) -> None:
    with session_scope(session_factory) as s:
        c, (a, b) = add_cluster(s, nodes=2, devices_per_node=4, sync_ports=(0, 0))
        (task,) = allocate(s, _job(s), tiny_spec(), hand_option([(c, a, 0), (c, a, 1)]), attempt=1)
        assert task.sync_port is None and task.worker_config["sync"]["mode"] == "none"
        assert task.worker_config["sync"]["peers"] == {} and task.worker_config["parallel"]["dp_local"] == 2
        with pytest.raises(FailedPrecondition, match="no sync port"):
            allocate(s, _job(s), tiny_spec(), hand_option([(c, a, 2), (c, b, 0)]), attempt=1)
        # ...and a correct rejection leaves nothing half-allocated in the caller's transaction
        assert len(s.scalars(select(Allocation).where(Allocation.active.is_(True))).all()) == 2


def test_a_replica_across_nodes_is_one_group_whose_leader_holds_its_rendezvous_port(
    session_factory: sessionmaker[Session],
) -> None:
    with session_scope(session_factory) as s:
        c, (a, b) = add_cluster(s, nodes=2, devices_per_node=3, sync_ports=(25000, 25001))
        tasks = {
            t.node_id: t
            for t in allocate(s, _job(s), tiny_spec(), hand_option([(c, a, 0), (c, b, 0)], tp=2), attempt=1)
        }
        groups = {n: parse_worker_config(t.worker_config).group for n, t in tasks.items()}
        assert groups[a.id] is not None and groups[b.id] is not None
        assert (groups[a.id].node_rank, groups[b.id].node_rank) == (0, 1)
        assert groups[a.id].master_port == groups[b.id].master_port == 25000
        assert {t.sync_port for t in tasks.values()} == {None}  # one participant: no WAN sync
        # The rendezvous port stays taken while the group runs: the next group gets the other one,
        # and a third finds the range used up. With the server's secret, as the placer allocates,
        # the group's nodes share one store secret and each has its own certificate of the job's CA.
        second = allocate(
            s, _job(s), tiny_spec(), hand_option([(c, a, 1), (c, b, 1)], tp=2), attempt=1, sync_secret="s3"
        )
        rdzv = [parse_worker_config(t.worker_config).group for t in second]
        assert all(g is not None and g.secured for g in rdzv)
        assert len({g.store_secret for g in rdzv}) == 1 and len({g.tls_cert_pem for g in rdzv}) == 2  # type: ignore[union-attr]
        assert {t.worker_config["group"]["master_port"] for t in second} == {25001}
        with pytest.raises(AllocationConflict, match="sync ports 25000-25001 are in use"):
            allocate(s, _job(s), tiny_spec(), hand_option([(c, a, 2), (c, b, 2)], tp=2), attempt=1)


def test_two_groups_across_nodes_each_lead_with_a_sync_port_and_a_rendezvous_port(
    session_factory: sessionmaker[Session],
) -> None:
    with session_scope(session_factory) as s:
        c, (a, b, x, y) = add_cluster(s, nodes=4, devices_per_node=1, sync_ports=(26000, 26003))
        option = hand_option([(c, a, 0), (c, b, 0), (c, x, 0), (c, y, 0)], tp=2)
        tasks = {t.node_id: t for t in allocate(s, _job(s), tiny_spec(), option, attempt=1)}
        for lead, other in ((a, b), (x, y)):
            cfg, cfg2 = tasks[lead.id].worker_config, tasks[other.id].worker_config
            assert tasks[lead.id].sync_port is not None and tasks[other.id].sync_port is None
            port = cfg["group"]["master_port"]
            assert port != tasks[lead.id].sync_port and 26000 <= port <= 26003
            assert cfg2["group"] == cfg["group"] | {"node_rank": 1}
            assert cfg["sync"]["listen"] == f"127.0.0.1:{tasks[lead.id].sync_port}"
        # the two groups are the job's two sync participants
        assert {tasks[a.id].worker_config["region"], tasks[x.id].worker_config["region"]} == set(
            tasks[a.id].worker_config["sync"]["peers"]
        ) | {tasks[a.id].worker_config["region"]}


def test_a_replica_across_clusters_is_refused(session_factory: sessionmaker[Session]) -> None:
    with session_scope(session_factory) as s:
        c1, (a,) = add_cluster(s, name="c1")
        c2, (b,) = add_cluster(s, name="c2")
        with pytest.raises(FailedPrecondition, match="across clusters"):
            allocate(s, _job(s), tiny_spec(), hand_option([(c1, a, 0), (c2, b, 0)], tp=2), attempt=1)


def test_a_group_across_clusters_is_refused_until_the_link_between_them_is_declared_private(
    session_factory: sessionmaker[Session],
) -> None:
    """The plan may predate the link's change: allocation checks again, and a refusal is a conflict
    (the placer re-plans on a fresh snapshot, which offers no such group)."""
    with session_scope(session_factory) as s:
        c1, (a,) = add_cluster(s, name="c1")
        c2, (b,) = add_cluster(s, name="c2")
        a.cross_cluster_host, b.cross_cluster_host = "10.0.0.1", "10.0.0.2"
        option = hand_option([(c1, a, 0), (c2, b, 0)], tp=2)
        with pytest.raises(AllocationConflict, match=r"not declared private: \[\('eu-west', 'eu-west'\)\]"):
            allocate(s, _job(s), tiny_spec(), option, attempt=1)
        link = add_link(s, "eu-west", "eu-west", bandwidth_gbps=10.0, latency_ms=1.0)
        with pytest.raises(AllocationConflict, match="not declared private"):
            allocate(s, _job(s), tiny_spec(), option, attempt=1)
        link.private = True
        s.flush()
        tasks = allocate(s, _job(s), tiny_spec(), option, attempt=1)
        assert {t.worker_config["group"]["master_addr"] for t in tasks} == {"10.0.0.1"}


def test_ports_go_round_the_range_instead_of_reusing_a_just_freed_one(
    session_factory: sessionmaker[Session],
) -> None:
    with session_scope(session_factory) as s:
        eu, (n1,) = add_cluster(s, region="eu-west", devices_per_node=2, sync_ports=(23000, 23001))
        us, (n2,) = add_cluster(s, region="us-east", devices_per_node=2, sync_ports=(24000, 24002))
        seen = []
        for _ in range(4):
            tasks = allocate(s, _job(s), tiny_spec(), hand_option([(eu, n1, 0), (us, n2, 0)]), attempt=1)
            seen.append(sorted(t.sync_port for t in tasks))
            for t in tasks:  # finished: devices and ports are free again
                t.status = "cancelled"
            release(s, tasks[0].job_id)
            s.flush()
        assert seen == [[23000, 24000], [23001, 24001], [23000, 24002], [23001, 24000]]


def test_per_stage_rings_get_a_port_per_stage_leader_and_keep_them_while_they_run(
    session_factory: sessionmaker[Session],
) -> None:
    """Replica 0 a pipeline over nodes a and b, replica 1 whole on node n: each node listens once per
    stage whose leader it holds (n twice), and those ports stay taken while the job runs."""
    from control_layer.planner.plan_types import PlannedTask

    with session_scope(session_factory) as s:
        c, (a, b, n, d, e) = add_cluster(s, nodes=5, devices_per_node=4, sync_ports=(27000, 27002))

        def task(r: int, stage: int, node: Node, device: int) -> PlannedTask:
            return PlannedTask(
                dp_rank=r,
                pp_stage=stage,
                tp_rank=0,
                cluster=c.id,
                node=node.id,
                device=device,
                region=c.region,
            )

        def option(device: int, first: Node, second: Node) -> object:
            tasks = [
                task(0, 0, first, device),
                task(0, 1, second, device),
                task(1, 0, n, 2 * device),
                task(1, 1, n, 2 * device + 1),
            ]
            base = hand_option([(c, first, device), (c, n, 2 * device)])
            return base.model_copy(update={"pp": 2, "n_micro_batches": 2, "tasks": tasks})

        tasks = {t.node_id: t for t in allocate(s, _job(s), tiny_spec(), option(0, a, b), attempt=1)}
        rings = {node: t.worker_config["sync"]["stages"] for node, t in tasks.items()}
        listen = {node: [r["listen"] for r in stages] for node, stages in rings.items()}
        assert listen[a.id][0] == f"127.0.0.1:{tasks[a.id].sync_port}" and listen[a.id][1] is None
        assert listen[b.id][0] is None and listen[b.id][1] == f"127.0.0.1:{tasks[b.id].sync_port}"
        assert listen[n.id] == ["127.0.0.1:27000", "127.0.0.1:27001"] and tasks[n.id].sync_port == 27000
        assert tasks[a.id].worker_config["group"]["master_port"] not in {
            int(x.rsplit(":", 1)[1]) for x in listen[a.id] if x
        }
        # Each stage's ring pairs the stage's leaders: a with n for stage 0, b with n for stage 1.
        key_a, key_n = tasks[a.id].worker_config["region"], tasks[n.id].worker_config["region"]
        assert rings[n.id][0]["peers"] == {key_a: listen[a.id][0]}
        assert rings[n.id][1]["peers"] == {key_a: listen[b.id][1]}
        assert rings[a.id][1]["peers"] == {key_n: listen[n.id][1]}
        for t in tasks.values():
            parse_worker_config(t.worker_config)
        # Node n's second stage port is in no task's sync_port: it is still seen as taken, so a
        # second such job (its pipeline on fresh nodes) finds one port left on n where it needs two.
        with pytest.raises(AllocationConflict, match=f"node {n.id}: all sync ports 27000-27002 are in use"):
            allocate(s, _job(s), tiny_spec(), option(1, d, e), attempt=1)
