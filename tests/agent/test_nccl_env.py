"""The node's NCCL environment for its workers, and a collective that times out ending its task
with a clear reason (a real two-rank group under torchrun, over gloo, whose timeout the same
setting drives) instead of a hang."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.nccl_env import collective_failure, debug_tail, nccl_env
from agent.settings import AgentSettings
from agent.workers import FAILED, Assignment, WorkerRun, worker_env
from proto.cpn.agent.v1 import agent_pb2
from training.parallel.init import pg_timeout_s

STALL = Path(__file__).with_name("stall_collective.py")
# Lines in the form PyTorch's NCCL watchdog (ProcessGroupNCCL) and its NCCL error checks print.
WATCHDOG = (
    "[rank3]:[E1129 11:02:41.184000 3187 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632]"
    " [Rank 3] Watchdog caught collective operation timeout:"
    " WorkNCCL(SeqNum=1841, OpType=ALLREDUCE, NumelIn=16777216, NumelOut=16777216, Timeout(ms)=600000)"
    " ran for 600086 milliseconds before timing out."
)
REMOTE = (
    "[rank0]: torch.distributed.DistBackendError: NCCL error in:"
    " ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, remote process exited or there was a network"
    " error, NCCL version 2.21.5"
)


def settings(tmp: Path, **kw: object) -> AgentSettings:
    return AgentSettings(server="127.0.0.1:1", region="eu-west", cluster="c0", price_per_device_hour=1.0,
                         work_dir=tmp / "work", allow_command_override=True, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_the_environment_follows_the_node_settings(tmp_path: Path) -> None:
    env = nccl_env(
        tmp_path, socket_ifname="^docker,lo", ib_hca="mlx5_0:1,mlx5_1:1", timeout_s=300, debug="WARN"
    )
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "^docker,lo"
    assert env["NCCL_IB_HCA"] == "mlx5_0:1,mlx5_1:1"
    assert env["CPN_PG_TIMEOUT_S"] == "300" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "360"
    assert env["NCCL_DEBUG"] == "WARN" and env["NCCL_DEBUG_FILE"] == str(tmp_path / "nccl-debug.%h.%p.log")
    quiet = nccl_env(tmp_path, socket_ifname="", ib_hca="", timeout_s=600, debug="")
    assert not {"NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_DEBUG", "NCCL_DEBUG_FILE"} & quiet.keys()
    a = Assignment("a1", "j1", 0, (0,), 1, {})
    env = worker_env({}, a, device_kind="cpu", config_path=tmp_path / "c.json", nccl=quiet)
    assert env["CPN_PG_TIMEOUT_S"] == "600" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert pg_timeout_s({"CPN_PG_TIMEOUT_S": "300"}) == 300.0
    for bad in ("nan", "inf", "0", "1e9", "soon"):
        assert pg_timeout_s({"CPN_PG_TIMEOUT_S": bad}) == 600.0


def test_settings_refuse_what_nccl_would_not_parse(tmp_path: Path) -> None:
    s = settings(tmp_path, nccl_socket_ifname="=ens1f0", nccl_ib_hca="^mlx5_2", nccl_debug="info")
    assert (s.nccl_socket_ifname, s.nccl_ib_hca, s.nccl_debug) == ("=ens1f0", "^mlx5_2", "INFO")
    for field, value in [("nccl_socket_ifname", "eth0 eth1"), ("nccl_socket_ifname", "eth0;rm"),
                         ("nccl_ib_hca", "mlx5_0:port1"), ("nccl_timeout_s", 5),
                         ("nccl_timeout_s", float("nan")), ("nccl_debug", "TRACE")]:  # fmt: skip
        with pytest.raises(ValidationError) as err:
            settings(tmp_path, **{field: value})
        assert err.value.errors()[0]["loc"] == (field,)


def test_failed_collectives_are_named_whatever_rank_spoke_last(tmp_path: Path) -> None:
    assert collective_failure(["Traceback (most recent call last):", WATCHDOG, "SIGABRT"]) == (
        "NCCL collective timed out: ALLREDUCE (sequence 1841) waited 600 s for a peer; a rank stopped or the"
        " network between ranks failed (NCCL's log is in the task's log)"
    )
    assert collective_failure([REMOTE]).startswith("NCCL failed (NCCL error): [rank0]: torch.distributed")
    assert collective_failure(["RuntimeError: CUDA out of memory"]) == ""
    (tmp_path / "nccl-debug.node1.4242.log").write_text(
        "".join(f"node1:4242 NCCL INFO line {i}\n" for i in range(50))
    )
    (tmp_path / "nccl-trace-rank-3").write_bytes(b"\x80\x04pickle")
    tail = debug_tail(tmp_path, lines_per_file=3)
    assert tail == [
        "[cpn-agent] --- nccl-debug.node1.4242.log (last 3 lines) ---",
        "node1:4242 NCCL INFO line 47",
        "node1:4242 NCCL INFO line 48",
        "node1:4242 NCCL INFO line 49",
        f"[cpn-agent] collectives in flight at the timeout: {tmp_path / 'nccl-trace-rank-3'}"
        " (read it with torchfrtrace)",
    ]


def test_a_collective_timeout_fails_the_task_with_that_reason(tmp_path: Path) -> None:
    s = settings(tmp_path, nccl_timeout_s=10)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(STALL),
    ]
    sent: list[agent_pb2.AgentMessage] = []
    run = WorkerRun(Assignment("a1", "j1", 0, (), 2, {"command": command}), s.work_dir.resolve() / "a1",
                    settings=s, device_kind="cpu", send=sent.append)  # fmt: skip
    asyncio.run(run.run())
    last = [m.task_status for m in sent if m.WhichOneof("kind") == "task_status"][-1]
    assert last.state == FAILED
    assert "collective timed out: a recv waited 10 s for a peer" in last.message, last.message
    assert not any("all-reduce returned" in m.log.line for m in sent if m.WhichOneof("kind") == "log")
