"""Users' code under bubblewrap: the argv the agent builds, and hostile entrypoints run by a real
agent process as sandboxed workers, each trying one escape.

Each hostile run has a control: the same code with the task's ``stage.sandbox`` off, where the
attempt succeeds. The sandboxed run failing it is therefore the sandbox's doing, not the test's.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from agent.sandbox import (
    SandboxLimits,
    SandboxProbe,
    exposure_problems,
    free_task_dirs,
    needs_sandbox,
    nvidia_minors,
    over_quota_reason,
    sandbox_command,
    sandboxed,
    task_limits,
    task_paths,
    tree_bytes,
)
from agent.settings import AgentSettings
from contracts.errors import InvalidArgument
from control_layer.dispatch import assignment_message, cancel_message
from orchestration.db.models import Node, Task
from tests.agent.conftest import REPO, AgentProcess, Launcher, Plane, close_plane, make_plane, node_of
from tests.resource_layer.harness import add_task, wait_for

QUOTA_GB = 0.02  # ~21 MB: the disk tests write past it quickly
MIB = 1 << 20


def settings(**kw: Any) -> AgentSettings:
    base: dict[str, Any] = {"server": "127.0.0.1:50051", "region": "eu-west", "cluster": "paris-1",
                            "price_per_device_hour": 1.0, "work_dir": Path("/srv/cpn")}  # fmt: skip
    return AgentSettings(**{**base, **kw})


# -- the argv -------------------------------------------------------------------------------------


def _pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_the_argv_hides_the_work_dir_then_shows_the_task_its_own_paths() -> None:
    s = settings(task_disk_gb=2, task_tmp_gb=1)
    run = Path("/srv/cpn/assignments/t1")
    argv = sandbox_command(
        ["python", "-m", "training.worker"],
        writable=[run, Path("/srv/cpn/checkpoints/j/x")],
        readable=[Path("/srv/cpn/cache/code-abc")],
        device_kind="cpu",
        device_indices=(0, 1),
        settings=s,
        as_root=True,
        nofile_hard=1 << 20,
    )
    assert argv[:3] == ["sh", "-c", 'trap "" TERM; exec "$0" "$@"']  # bwrap outlives a SIGTERM
    sep = argv.index("--")
    assert argv[3:sep] == ["prlimit", f"--fsize={2 * 1024**3}", "--nofile=32768", "--core=0"]
    bwrap = argv[sep + 1 : argv.index("--", sep + 1)]
    inner = argv[argv.index("--", sep + 1) + 1 :]  # the command, SIGTERM restored
    assert inner[:2] == [sys.executable, "-c"] and "SIG_DFL" in inner[2]
    assert inner[3:] == ["python", "-m", "training.worker"]
    assert bwrap[:3] == ["bwrap", "--ro-bind", "/"]
    # The hidden work dir comes before the task's own binds, which reappear inside it.
    hide = bwrap.index("/srv/cpn")
    assert bwrap[hide - 1] == "--tmpfs"
    assert _pairs(bwrap, "--bind") == [(str(run), str(run)), ("/srv/cpn/checkpoints/j/x",) * 2]
    assert _pairs(bwrap, "--ro-bind") == [("/", "/"), ("/srv/cpn/cache/code-abc",) * 2]
    assert min(bwrap.index("--bind"), bwrap.index("--ro-bind", 3)) > hide
    remount = bwrap.index("--remount-ro")
    assert remount > bwrap.index("--bind") and bwrap[remount + 1] == "/srv/cpn"
    for flag in ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-user", "--die-with-parent"):
        assert flag in bwrap
    assert "--unshare-net" not in bwrap and "--unshare-all" not in bwrap  # sync and torchrun need it
    assert bwrap[bwrap.index("--uid") + 1] == bwrap[bwrap.index("--gid") + 1] == "65534"
    assert bwrap[bwrap.index("--cap-drop") + 1] == "ALL"
    assert bwrap[bwrap.index("--unsetenv") + 1] == "CPN_AGENT_TOKEN"
    sizes = [bwrap[i + 1 : i + 4] for i, a in enumerate(bwrap) if a == "--size"]
    assert sizes == [[str(1024**3), "--tmpfs", "/tmp"], [str(1024**3), "--tmpfs", "/dev/shm"]]
    assert not [a for a in bwrap if a.startswith("/dev/nvidia")]  # a CPU task gets no GPU


def test_a_cuda_task_gets_its_own_gpus_nodes_only() -> None:
    argv = sandbox_command(
        ["x"],
        writable=[],
        readable=[],
        device_kind="cuda",
        device_indices=(1, 3),
        settings=settings(),
        as_root=False,
        minors={0: 0, 1: 2, 2: 1, 3: 3},
    )
    devs = [src for src, _ in _pairs(argv, "--dev-bind-try")]
    assert devs == ["/dev/nvidia2", "/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm",
                    "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]  # fmt: skip
    assert ("CUDA_DEVICE_ORDER", "PCI_BUS_ID") in _pairs(argv, "--setenv")
    assert "--cap-drop" not in argv  # not root: bwrap drops them itself


def test_nvidia_minors_come_from_the_drivers_files_in_bus_order(tmp_path: Path) -> None:
    for bus, minor in (("0000:41:00.0", 0), ("0000:01:00.0", 1)):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(f"Model: H200\nDevice Minor: {minor}\n")
    assert nvidia_minors(tmp_path) == {0: 1, 1: 0}
    assert nvidia_minors(tmp_path / "absent") == {}


def test_rlimits_follow_the_tasks_share_and_never_pass_the_agents_hard_limit() -> None:
    s = settings(task_disk_gb=1)
    assert task_limits(s, 4, nofile_hard=1 << 20) == SandboxLimits(1024**3, 65536)
    assert task_limits(s, 4, nofile_hard=20000).nofile == 20000
    assert task_limits(s, 0, nofile_hard=1 << 20).nofile == 16384


def test_user_code_is_what_has_an_entrypoint_unless_its_stage_turns_the_sandbox_off() -> None:
    assert needs_sandbox({"entrypoint": "m:f"})
    assert needs_sandbox({"entrypoint": "m:f", "stage": {"sandbox": True}})
    assert not needs_sandbox({"entrypoint": "m:f", "stage": {"sandbox": False}})
    assert not needs_sandbox({"model": {}})
    assert SandboxProbe(True, "").capability(False) == "bubblewrap"
    assert SandboxProbe(False, "x").capability(True) == "unsandboxed-allowed"
    assert SandboxProbe(False, "x").capability(False) == "none"


def test_no_path_may_expose_the_work_dir_its_secrets_or_other_tasks(tmp_path: Path) -> None:
    s = settings(state_file=Path("/etc/cpn/state.json"))
    bad = [Path("/srv/cpn"), Path("/srv/cpn/assignments"), Path("/srv"), Path("/etc/cpn"), Path("/")]
    assert len(exposure_problems(bad, s)) == len(bad)
    ok = [Path("/srv/cpn/assignments/t1"), Path("/srv/cpn/checkpoints/j"), Path("/srv/cpn/cache/x")]
    assert exposure_problems(ok, s) == []
    config = {"checkpoint": {"dir": "/srv/cpn/checkpoints/j/x"}, "outputs_dir": "/srv/cpn/assignments/t1/out",
              "data": {"path": "/srv/cpn/cache/data.bin"}}  # fmt: skip
    writable, readable = task_paths(
        config, Path("/srv/cpn/assignments/t1"), ["python"], {"PYTHONPATH": "/c:rel"}
    )
    assert writable == [Path("/srv/cpn/assignments/t1"), Path("/srv/cpn/checkpoints/j/x"),
                        Path("/srv/cpn/assignments/t1/out")]  # fmt: skip
    assert readable == [Path("/srv/cpn/cache/data.bin"), Path("/c")]
    # The agent's own PYTHONPATH above its work dir is left out rather than failing the task; a
    # writable one fails it.
    s, run = settings(work_dir=tmp_path / "w"), tmp_path / "w" / "assignments" / "t"
    argv, dirs = sandboxed(
        ["python"], {}, run, {"PYTHONPATH": str(tmp_path)}, device_kind="cpu", device_indices=(0,), settings=s
    )
    assert (str(tmp_path), str(tmp_path)) not in _pairs(argv, "--ro-bind") and dirs == [run]
    with pytest.raises(InvalidArgument, match="would expose"):
        bad = {"outputs_dir": str(tmp_path / "w")}
        sandboxed(["python"], bad, run, {}, device_kind="cpu", device_indices=(0,), settings=s)


def test_disk_use_counts_blocks_once_per_inode_and_freeing_keeps_the_agents_files(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"x" * MIB)
    os.link(tmp_path / "d" / "a", tmp_path / "d" / "b")
    (tmp_path / "worker.log").write_text("log")
    used = tree_bytes([tmp_path])
    assert MIB <= used < 2 * MIB
    assert over_quota_reason(used, 2 * MIB) is None
    assert "disk quota exceeded" in (over_quota_reason(used, MIB // 2) or "")
    free_task_dirs([tmp_path], keep=("worker.log",))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker.log"]


# -- hostile entrypoints under a real agent -------------------------------------------------------

# Each prints what it managed (``escaped``) as its result; targets come as argv[1].
READ = """
import json, sys
escaped = []
for path in json.loads(sys.argv[1]):
    try:
        with open(path, "rb") as f:
            f.read(64)
        escaped.append(path)
    except OSError:
        pass
print("CPN_RESULT " + json.dumps({"escaped": escaped}), flush=True)
"""

WRITE = """
import json, os, sys
escaped = []
for path in json.loads(sys.argv[1]):
    try:
        with open(path, "w") as f:
            f.write("escaped")
        escaped.append(path)
    except OSError:
        pass
print("CPN_RESULT " + json.dumps({"escaped": escaped}), flush=True)
"""

SIGNAL = """
import json, os, sys
pid, sig = json.loads(sys.argv[1])
try:
    os.kill(pid, sig)
    escaped = [f"signalled {pid}"]
except OSError as exc:
    escaped = []
    print(f"kill: {type(exc).__name__}", flush=True)
print("CPN_RESULT " + json.dumps({"escaped": escaped, "sees": os.path.exists(f"/proc/{pid}")}), flush=True)
"""

# Writes 1 MiB files into its run dir until it has written ``limit`` MiB (None: forever).
FILL = """
import json, os, sys
limit = json.loads(sys.argv[1])
chunk, n = os.urandom(1 << 20), 0
while limit is None or n < limit:
    with open(f"fill-{n}", "wb") as f:
        f.write(chunk)
    n += 1
print("CPN_RESULT " + json.dumps({"escaped": [f"{n} MiB"]}), flush=True)
"""

# One file of ``size`` MiB.
BIG = """
import json, os, sys
size = json.loads(sys.argv[1])
with open("big", "wb") as f:
    for _ in range(size):
        f.write(b"x" * (1 << 20))
print("CPN_RESULT " + json.dumps({"escaped": [f"{size} MiB in one file"]}), flush=True)
"""

# Records a SIGTERM in its run dir and exits, as a worker that checkpoints on the way out would.
TERM = """
import os, signal, sys, time
def on_term(*_):
    time.sleep(0.5)  # a checkpoint on the way out
    open("got-sigterm", "w").write("yes")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("waiting", flush=True)
while True:
    time.sleep(0.05)
"""


@dataclass
class Node_:
    plane: Plane
    agent: AgentProcess
    node: Node
    launcher: Launcher


@pytest.fixture(scope="module")
def boxed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node_]:
    """A real agent on a node where bubblewrap works, with a small per-task disk quota."""
    tmp = tmp_path_factory.mktemp("sandbox")
    plane = make_plane(tmp)
    launcher = Launcher(plane, tmp)
    try:
        # The entrypoints under test live in this repository's tests package, as a provider's own
        # modules would on its node: on the workers' path.
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        agent = launcher(task_disk_gb=str(QUOTA_GB), env=env)
        node = node_of(plane)
        wait_for(lambda: "registered as node" in agent.log(), timeout=60, what="the agent to register")
        # What a node holds that its tasks must not see: its key and another job's directory.
        (agent.work_dir / "node-key.pem").write_text("-----BEGIN PRIVATE KEY-----secret")
        other = agent.work_dir / "assignments" / "other-job"
        other.mkdir(parents=True)
        (other / "secret.txt").write_text("another tenant's data")
        yield Node_(plane, agent, node, launcher)
    finally:
        launcher.stop_all()
        close_plane(plane)


def user_config(script: str, arg: Any, *, sandbox: bool = True) -> dict[str, Any]:
    cfg = {"job_id": "j", "region": "eu-west", "cluster": "paris-1", "training": {"steps": 1},
           "entrypoint": "hostile:main", "data": {"kind": "byo"},
           "command": [sys.executable, "-c", script, json.dumps(arg)]}  # fmt: skip
    if not sandbox:
        cfg["stage"] = {"sandbox": False}
    return cfg


def dispatch(plane: Plane, node: Node, cfg: dict[str, Any], devices: list[int] | None = None) -> str:
    _, task_id = add_task(
        plane.ctx.session_factory, node.id, node.cluster_id, "eu-west", cfg, device_indices=devices or [0]
    )
    with plane.ctx.session_factory() as s:
        task = s.get(Task, task_id)
        assert task is not None
        plane.ctx.bus.publish(f"node.{node.id}", assignment_message(task))
    return task_id


def finished(plane: Plane, task_id: str, timeout: float = 60.0) -> Task:
    def row() -> Task | None:
        with plane.ctx.session_factory() as s:
            t = s.get(Task, task_id)
            return t if t is not None and t.status in ("succeeded", "failed", "cancelled") else None

    return wait_for(row, timeout=timeout, what=f"task {task_id} to end")


def run_hostile(b: Node_, script: str, arg: Any, *, sandbox: bool) -> Task:
    return finished(b.plane, dispatch(b.plane, b.node, user_config(script, arg, sandbox=sandbox)))


def escaped(task: Task) -> list[str]:
    assert task.status == "succeeded", task.message
    assert task.result is not None, task.message
    return task.result["escaped"]


def test_the_node_registers_that_it_runs_users_code_sandboxed(boxed: Node_) -> None:
    with boxed.plane.ctx.session_factory() as s:
        node = s.get(Node, boxed.node.id)
        assert node is not None and node.sandbox == "bubblewrap"
    assert "sandbox: bubblewrap works" in boxed.agent.log()


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandboxed", "control"])
def test_users_code_cannot_read_the_node_key_state_file_agent_or_another_jobs_dir(
    boxed: Node_, sandbox: bool
) -> None:
    work = boxed.agent.work_dir.resolve()
    targets = [
        str(work / "node-key.pem"),
        str(work / "agent-state.json"),  # the node's token
        str(work / "assignments" / "other-job" / "secret.txt"),
        f"/proc/{boxed.agent.proc.pid}/environ",  # the agent's environment (its enrollment token)
    ]
    got = escaped(run_hostile(boxed, READ, targets, sandbox=sandbox))
    assert got == ([] if sandbox else targets)


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandboxed", "control"])
def test_users_code_cannot_write_outside_its_own_directories(boxed: Node_, sandbox: bool) -> None:
    work = boxed.agent.work_dir.resolve()
    targets = [str(work / "escape"), str(work / "assignments" / "other-job" / "escape")]
    if sandbox:  # the control leaves the node's system directories alone
        targets += ["/etc/cpn-escape", "/usr/cpn-escape", str(REPO / "cpn-escape")]
    try:
        got = escaped(run_hostile(boxed, WRITE, targets, sandbox=sandbox))
        assert got == ([] if sandbox else targets)
        assert [t for t in targets if Path(t).exists()] == ([] if sandbox else targets)
    finally:
        for t in targets:
            Path(t).unlink(missing_ok=True)


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandboxed", "control"])
def test_users_code_cannot_see_or_signal_the_agent(boxed: Node_, sandbox: bool) -> None:
    pid = boxed.agent.proc.pid
    # Sandboxed, the worst a tenant could send; the control only asks whether it could (signal 0).
    task = run_hostile(boxed, SIGNAL, [pid, signal.SIGKILL if sandbox else 0], sandbox=sandbox)
    assert escaped(task) == ([] if sandbox else [f"signalled {pid}"])
    assert task.result is not None and task.result["sees"] is (not sandbox)
    assert boxed.agent.proc.poll() is None  # the agent lives on, and still runs tasks:
    assert escaped(run_hostile(boxed, READ, [], sandbox=True)) == []


def test_users_code_filling_the_disk_is_stopped_at_its_quota_and_its_files_go(boxed: Node_) -> None:
    """Writing without end: only the agent's guard can stop it."""
    task = run_hostile(boxed, FILL, None, sandbox=True)
    assert task.status == "failed" and "disk quota exceeded" in task.message, task.message
    run_dir = boxed.agent.work_dir / "assignments" / task.id
    assert tree_bytes([run_dir]) < QUOTA_GB * 1024**3  # what it wrote is gone again
    assert sorted(p.name for p in run_dir.iterdir()) == ["ended", "worker.log", "worker_config.json"]


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandboxed", "control"])
def test_users_code_past_its_quota_fails_even_when_it_ends_first(boxed: Node_, sandbox: bool) -> None:
    """Many files (the quota checked at exit), and one big file (RLIMIT_FSIZE): the control
    writes both in full and succeeds."""
    want = int(QUOTA_GB * 1024) + 8  # MiB
    for script in (FILL, BIG):
        task = run_hostile(boxed, script, want, sandbox=sandbox)
        if sandbox:
            assert task.status == "failed" and "disk quota exceeded" in task.message, task.message
        else:
            assert escaped(task) and tree_bytes([boxed.agent.work_dir / "assignments" / task.id]) > want * MIB
            free_task_dirs([boxed.agent.work_dir / "assignments" / task.id])


def test_a_cancelled_sandboxed_task_gets_its_sigterm(boxed: Node_) -> None:
    """The worker has the whole grace period: bwrap, which ignores the SIGTERM, does not cut it
    short by dying and taking the sandbox with it."""
    plane, node = boxed.plane, boxed.node
    task_id = dispatch(plane, node, user_config(TERM, None))
    run_dir = boxed.agent.work_dir / "assignments" / task_id
    log = run_dir / "worker.log"
    wait_for(lambda: log.is_file() and "waiting" in log.read_text(), timeout=60, what="the worker to start")
    with plane.ctx.session_factory() as s:
        row = s.get(Task, task_id)
        assert row is not None
        plane.ctx.bus.publish(f"node.{node.id}", cancel_message(row, "test"))
    task = finished(plane, task_id)
    assert task.status == "cancelled", task.message
    assert (run_dir / "got-sigterm").read_text() == "yes"


def test_a_users_torchrun_job_trains_under_the_sandbox(boxed: Node_) -> None:
    """The real launch path: torchrun, two gloo ranks over the private /dev/shm and loopback,
    the BYO example's model, a checkpoint in the task's checkpoint dir."""
    cfg = {"job_id": "j", "region": "eu-west", "cluster": "paris-1", "device": "cpu",
           "data": {"kind": "byo", "seed": 1}, "entrypoint": "tests.training.byo_example:build",
           "parallel": {"dp_local": 2}, "training": {"steps": 30, "local_batch": 16, "lr": 3e-2},
           "checkpoint": {"dir": "checkpoints/j/sandboxed", "every": 10}}  # fmt: skip
    task = finished(boxed.plane, dispatch(boxed.plane, boxed.node, cfg, devices=[0, 1]), timeout=240)
    assert task.status == "succeeded", task.message
    assert task.result is not None and task.result["steps"] == 30
    assert math.isfinite(task.result["final_loss"])
    assert any((boxed.agent.work_dir / "checkpoints" / "j" / "sandboxed").iterdir())
    started = [line for line in boxed.agent.log().splitlines() if f"assignment {task.id}: started" in line]
    assert started and " bwrap " in started[0] and "training.worker" in started[0]


# -- a node without a working sandbox -------------------------------------------------------------


def _no_bwrap_env(tmp: Path) -> dict[str, str]:
    """PATH with the interpreter alone: bwrap is not found, as on a node without it."""
    bin_dir = tmp / "bin-without-bwrap"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("sh",):
        link = bin_dir / tool
        if not link.exists():
            link.symlink_to(f"/bin/{tool}")
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{bin_dir}"}


def test_a_node_without_a_sandbox_refuses_users_code_unless_its_provider_allows_it(tmp_path: Path) -> None:
    plane = make_plane(tmp_path)
    launcher = Launcher(plane, tmp_path)
    try:
        env = _no_bwrap_env(tmp_path)
        bare = launcher("bare", cluster="bare-1", env=env)
        allowed = launcher("allowed", cluster="open-1", env=env, allow_unsandboxed="")
        bare_node, allowed_node = node_of(plane, "bare-1"), node_of(plane, "open-1")
        with plane.ctx.session_factory() as s:
            got = {n.id: n.sandbox for n in s.scalars(select(Node))}
        assert got == {bare_node.id: "none", allowed_node.id: "unsandboxed-allowed"}
        refused = finished(plane, dispatch(plane, bare_node, user_config(READ, [])))
        assert refused.status == "failed"
        assert "needs a sandbox" in refused.message and "bwrap not found" in refused.message
        assert "--allow-unsandboxed" in refused.message
        ran = finished(plane, dispatch(plane, allowed_node, user_config(READ, [])))
        assert escaped(ran) == []  # ran, unconfined
        builtin = {"job_id": "j", "region": "eu-west", "cluster": "bare-1", "training": {"steps": 1},
                   "command": [sys.executable, "-c", "print('CPN_RESULT {\"escaped\": []}')"]}  # fmt: skip
        assert escaped(finished(plane, dispatch(plane, bare_node, builtin))) == []  # not users' code
        assert "UNCONFINED" in allowed.log() and "refuses users' code" in bare.log()
    finally:
        launcher.stop_all()
        close_plane(plane)
