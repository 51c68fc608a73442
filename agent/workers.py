"""One assignment's workers, from launch to exit: a torchrun process tree the agent supervises.

The tree runs under a keeper (``contracts.lifetime``): torchrun starts its ranks in sessions of
their own, out of reach of a signal to its process group, so the keeper, a subreaper, stops the
tree as a whole (SIGTERM to torchrun's group, then SIGKILL to every process of the tree after the
grace period) and ends it at once when the agent dies, by any signal. ``stop_leftover`` remains
for a keeper a previous agent process left (one killed itself, say).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import ssl
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent import staging, uploads
from agent.checkpoint_transfer import has_checkpoint, run_copy
from agent.fetch import Cancelled
from agent.launchers import READ_LIMIT, Launched, Launcher, LocalLauncher, TaskShape
from agent.nccl_env import collective_failure, debug_tail, is_collective_line, nccl_env
from agent.output import (
    ERROR_PREFIX,
    LineBudget,
    MetricsTracker,
    parse_prefixed,
)
from agent.sandbox import (
    disk_quota_bytes,
    free_task_dirs,
    guard_disk,
    over_quota_reason,
    sandboxed,
    tree_bytes,
)
from agent.settings import AgentSettings
from agent.tls import http_verify, plain_http_hosts
from contracts.artifacts import CHECKPOINT_OUTPUT
from contracts.checkpoint_transfer import CheckpointTicket, CheckpointTls
from contracts.errors import InvalidArgument
from contracts.lifetime import kill_tree
from contracts.lost_notices import LostNotice, append_notice
from contracts.metrics import METRIC_PREFIX, RESULT_PREFIX
from contracts.registration import DeviceReport
from contracts.worker_config import LOOPBACK, MAX_TIME_LIMIT_S, NodeGroupSpec, StageSpec
from proto.cpn.agent.v1 import agent_pb2

log = logging.getLogger(__name__)

LAUNCHER = "training.launch"  # torchrun, ranks forked from a preloaded worker
COMMAND_KEY = "command"  # worker_config key naming an argv to run instead of torchrun (tests only)
MAX_LINE = 4000
DEFAULT_TIME_LIMIT_S = 24 * 3600.0  # a scheduler's time limit for a task whose config names none
KEEPER_SLACK_S = 5.0  # past the kill grace: a keeper still there then has failed to end its tree
ENDED_MARK = "ended"  # touched in the run dir when the assignment ends here
AGENT_FILES = ("worker.log", "worker_config.json", ENDED_MARK)  # the agent's own files in a run dir

SUCCEEDED, FAILED, CANCELLED = (
    agent_pb2.TASK_STATE_SUCCEEDED,
    agent_pb2.TASK_STATE_FAILED,
    agent_pb2.TASK_STATE_CANCELLED,
)


@dataclass(frozen=True)
class Assignment:
    assignment_id: str
    job_id: str
    attempt: int
    device_indices: tuple[int, ...]
    nproc: int
    worker_config: dict[str, Any] = field(hash=False)

    @classmethod
    def from_proto(cls, a: agent_pb2.Assignment) -> Assignment:
        if not a.assignment_id:
            raise InvalidArgument("assignment.assignment_id: required")
        if a.nproc < 1:
            raise InvalidArgument(f"assignment.nproc: must be >= 1, got {a.nproc}")
        try:
            config = json.loads(a.worker_config_json or "{}")
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"assignment.worker_config_json: not JSON ({exc})") from exc
        if not isinstance(config, dict):
            raise InvalidArgument("assignment.worker_config_json: must be a JSON object")
        return cls(a.assignment_id, a.job_id, a.attempt, tuple(a.device_indices), a.nproc, config)

    @property
    def total_steps(self) -> int:
        steps = (self.worker_config.get("training") or {}).get("steps", 0)
        return steps if isinstance(steps, int) else 0


def worker_command(
    a: Assignment, config_path: Path, *, allow_override: bool, python: str = sys.executable
) -> list[str]:
    """torchrun over ``training.worker`` (under ``python``: a user's venv, or the agent's own
    interpreter), or the config's test-only ``command`` where allowed."""
    override = a.worker_config.get(COMMAND_KEY)
    if override is not None:
        if not allow_override:
            raise InvalidArgument("worker_config.command: this agent does not allow command overrides")
        if not (isinstance(override, list) and override and all(isinstance(x, str) for x in override)):
            raise InvalidArgument("worker_config.command: must be a non-empty list of strings")
        return list(override)
    launcher, rendezvous = rendezvous_args(a.worker_config.get("group"), a.job_id)
    return [
        python,
        "-m",
        launcher,
        *rendezvous,
        "--nproc-per-node",
        str(a.nproc),
        "-m",
        "training.worker",
        "--config",
        str(config_path),
    ]


def rendezvous_args(group: Any, job_id: str) -> tuple[str, list[str]]:
    """The launcher module and its rendezvous arguments. The launcher is ``training.launch``,
    torchrun whose ranks fork from one process that imported the worker once. Standalone for a
    node's own group; for a group spanning nodes, node rank 0's store with node ranks as the
    control plane gave them (not c10d's dynamic rendezvous, which numbers nodes by arrival: the
    plan put stage s on a chosen node). With the job's credentials, the authenticated rendezvous
    (``training.rendezvous``: TLS between nodes, keys under the job's secret); without, which the
    config allows on loopback only, torchrun's static one."""
    if group is None:
        return LAUNCHER, ["--standalone"]
    try:
        spec = NodeGroupSpec.model_validate(group)
    except ValidationError as exc:
        raise InvalidArgument(f"worker_config.group: {exc.errors()[0]['msg']}", field="group") from None
    if not spec.secured and spec.master_addr not in LOOPBACK:
        raise InvalidArgument(
            f"worker_config.group: a rendezvous at {spec.master_addr} needs the job's credentials"
            " (tls_ca_pem, tls_cert_pem, tls_key_pem, store_secret); without them, loopback only",
            field="group",
        )
    if spec.secured:
        host = f"[{spec.master_addr}]" if ":" in spec.master_addr else spec.master_addr
        return LAUNCHER, [
            "--nnodes",
            str(spec.nnodes),
            "--rdzv-backend",
            "cpn-tls",
            "--rdzv-endpoint",
            f"{host}:{spec.master_port}",
            "--rdzv-id",
            job_id,
            "--rdzv-conf",
            f"rank={spec.node_rank}",
        ]
    return LAUNCHER, [
        "--nnodes",
        str(spec.nnodes),
        "--node-rank",
        str(spec.node_rank),
        "--master-addr",
        spec.master_addr,
        "--master-port",
        str(spec.master_port),
    ]


def worker_env(
    base: Mapping[str, str],
    a: Assignment,
    *,
    device_kind: str,
    config_path: Path,
    devices: Sequence[DeviceReport] = (),
    nccl: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The worker's environment. CUDA workers see their devices by UUID (``devices``, the
    assignment's in its order): an agent that inherited a restricted CUDA_VISIBLE_DEVICES numbers
    its devices 0.. over its share, which are not the node's ordinals, while a UUID names the same
    GPU in every process. ``nccl``: the node's NCCL settings (``agent.nccl_env``)."""
    env = dict(base)
    env.update(
        CPN_WORKER_CONFIG=str(config_path),
        CPN_ASSIGNMENT_ID=a.assignment_id,
        CPN_JOB_ID=a.job_id,
        PYTHONUNBUFFERED="1",
        # The worker reports its start-up against this (training.worker.SPAWNED_AT_ENV).
        CPN_SPAWNED_AT=repr(time.time()),
    )
    if device_kind == "cuda":
        uuids = [d.uuid for d in devices]
        named = len(uuids) == len(a.device_indices) and all(uuids)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids) if named else ",".join(str(i) for i in a.device_indices)
        # Indices (a node without NVML figures) count in nvidia-smi's order, as Slurm's do.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    else:
        env["OMP_NUM_THREADS"] = "1"  # one thread per CPU slot: slots do not oversubscribe cores
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(nccl or {})  # the process group's timeout and socket interface hold for gloo too
    return env


def bus_indices(a: Assignment, devices: Sequence[DeviceReport]) -> tuple[int, ...]:
    """The assignment's GPUs in the node's PCI bus order (what the sandbox's /dev nodes follow);
    its own indices where the node numbered none (no NVML: they are the bus order already)."""
    found = tuple(d.bus_index for d in devices)
    return found if len(found) == len(a.device_indices) and all(i >= 0 for i in found) else a.device_indices


def resolve_checkpoint_dir(config: dict[str, Any], work_dir: Path) -> dict[str, Any]:
    """A relative ``checkpoint.dir`` is under the agent's work dir, where it outlives the
    assignment (a task re-placed on this node resumes from it). The control plane may not name a
    place outside it."""
    ck = config.get("checkpoint")
    if not isinstance(ck, dict) or not isinstance(ck.get("dir"), str):
        return config
    path = Path(ck["dir"])
    if path.is_absolute() or ".." in path.parts:
        raise InvalidArgument(
            f"worker_config.checkpoint.dir: must be relative to the agent's work dir, got {ck['dir']!r}"
        )
    return config | {"checkpoint": ck | {"dir": str(work_dir.resolve() / path)}}


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_leftover(pgid: int, run_dir: str, grace_s: float) -> bool:
    """Stop a worker tree's keeper a previous agent process left running (a keeper ends its tree
    when its agent dies, so this finds one only where the keeper failed). The keeper's working
    directory must still be the assignment's directory, so a recycled pid is never signalled."""
    try:
        if os.readlink(f"/proc/{pgid}/cwd") != str(Path(run_dir).resolve()):
            return False
    except OSError:
        return False
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s + KEEPER_SLACK_S
    while time.monotonic() < deadline and Path(f"/proc/{pgid}").exists():
        time.sleep(0.05)
    kill_tree(pgid)
    return True


def _status(
    a: Assignment,
    state: int,
    message: str = "",
    exit_code: int = 0,
    result_json: str = "",
    lost: bool = False,
) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(
        task_status=agent_pb2.TaskStatus(
            assignment_id=a.assignment_id,
            state=state,
            message=message[:2000],
            exit_code=exit_code,
            result_json=result_json,
            lost=lost and state == agent_pb2.TASK_STATE_FAILED,
        )
    )


class WorkerRun:
    """Launches one assignment, forwards what it prints, reports how it ended."""

    def __init__(
        self,
        assignment: Assignment,
        run_dir: Path,
        *,
        settings: AgentSettings,
        device_kind: str,
        send: Callable[[agent_pb2.AgentMessage], None],
        on_spawn: Callable[[WorkerRun], None] = lambda run: None,
        sandbox: bool = False,
        launcher: Launcher | None = None,
        devices: Sequence[DeviceReport] = (),
    ) -> None:
        self.assignment = assignment
        self._launcher: Launcher = launcher or LocalLauncher()
        self.run_dir = run_dir
        self._settings = settings
        self._device_kind = device_kind
        self._send = send
        self._on_spawn = on_spawn
        self.pgid: int | None = None
        self.record: dict[str, str | int] = {}  # how the state file names its workers, once launched
        self.current: agent_pb2.AgentMessage = _status(assignment, agent_pb2.TASK_STATE_STARTING)
        self.finished_at: float | None = None  # monotonic
        self._proc: Launched | None = None
        self._stop: tuple[int, str] | None = None  # (final state, reason) once asked to stop
        self._preempt: str | None = None  # the reason, once asked to checkpoint and stop
        self._metrics = MetricsTracker(total_steps=assignment.total_steps)
        self._metrics_pending = False
        self._metrics_sent_at = 0.0
        self._budget = LineBudget(settings.log_lines_per_s, settings.log_burst)
        self._result: dict[str, Any] | None = None
        self._spawned_at: float | None = None  # monotonic, when the worker group was started
        self._result_at: float | None = None  # monotonic, when its result line arrived
        self._error: str | None = None
        self._stderr_tail: deque[str] = deque(maxlen=8)
        self._collective_lines: deque[str] = deque(maxlen=8)  # how a collective failed, if one did
        self._devices = tuple(devices)  # the assignment's, in its order (their UUIDs, bus indices)
        self._sandbox = sandbox  # users' code: run confined (agent.sandbox)
        self._quota_dirs: list[Path] = []  # what the task's disk quota covers, when sandboxed
        self._over_quota = False
        self._staged: staging.Staged | None = None
        self._stage_cancel = threading.Event()  # set to stop staging (a cancel before launch)
        self._extra: dict[str, Any] = {}  # the agent's own figures, merged into the worker's result
        self._checkpoint_dir: Path | None = None
        self._not_started: str | None = None  # why, once its scheduler kept it queued too long

    @property
    def done(self) -> bool:
        return self.finished_at is not None

    @property
    def scheduler_slots(self) -> int:
        """The slots its workers hold once started: its GPUs, or a CPU per process."""
        return len(self.assignment.device_indices) if self._device_kind == "cuda" else self.assignment.nproc

    @property
    def lost_notices_path(self) -> Path:
        return self.run_dir / "peers_lost.jsonl"

    @property
    def preempt_path(self) -> Path:
        """Created to ask the workers to checkpoint and stop (``training.preemption``)."""
        return self.run_dir / "preempt"

    def note_peer_lost(self, participant: str, address: str, reason: str) -> None:
        """Pass the control plane's word that a peer is lost to the running worker."""
        if self.done or not self.run_dir.is_dir():
            return
        append_notice(self.lost_notices_path, LostNotice(participant, address, reason))

    def _report(
        self, state: int, message: str = "", exit_code: int = 0, result_json: str = "", lost: bool = False
    ) -> None:
        self.current = _status(self.assignment, state, message, exit_code, result_json, lost)
        self._send(self.current)

    async def run(self) -> None:
        """The whole life of the assignment; returns once its final state has been reported."""
        a = self.assignment
        self._report(agent_pb2.TASK_STATE_STARTING, "launching")
        await self._fetch_checkpoint()
        if not await self._stage():
            return
        staged = self._staged
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            config_path = self.run_dir / "worker_config.json"
            config = {k: v for k, v in a.worker_config.items() if k != COMMAND_KEY}
            if isinstance(config.get("checkpoint"), dict):  # the agent's, for copies: not the worker's
                config["checkpoint"] = {k: v for k, v in config["checkpoint"].items() if k != "tls"}
            config = resolve_checkpoint_dir(config, self._settings.work_dir)
            if isinstance(config.get("sync"), dict):  # where the control plane's lost-peer notices land
                config["sync"] = config["sync"] | {"lost_notices": str(self.lost_notices_path)}
            config["preempt_file"] = str(self.preempt_path)
            config = staging.apply_stage(config, staged, self.run_dir)
            if isinstance(config.get("outputs_dir"), str):
                Path(config["outputs_dir"]).mkdir(parents=True, exist_ok=True)
            ck = config.get("checkpoint")
            if isinstance(ck, dict) and isinstance(ck.get("dir"), str):
                self._checkpoint_dir = Path(ck["dir"])
            config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
            python = staged.python if staged is not None else sys.executable
            cmd = worker_command(
                a, config_path, allow_override=self._settings.allow_command_override, python=python
            )
            env = worker_env(
                os.environ,
                a,
                device_kind=self._device_kind,
                config_path=config_path,
                devices=self._devices,
                nccl=self._nccl(),
            )
            if (path := staging.code_pythonpath(staged, env.get("PYTHONPATH"))) is not None:
                env["PYTHONPATH"] = path
            if self._sandbox:
                cmd, self._quota_dirs = sandboxed(
                    cmd,
                    config,
                    self.run_dir,
                    env,
                    device_kind=self._device_kind,
                    device_indices=bus_indices(a, self._devices),
                    settings=self._settings,
                )
            if self._stop is not None:
                return self._finish(self._stop[0], self._stop[1], 0)
            self._spawned_at = time.monotonic()
            self._proc = await self._launcher.launch(
                cmd, cwd=self.run_dir, env=env, grace_s=self._settings.kill_grace_s, shape=self._shape()
            )
        except (InvalidArgument, OSError) as exc:
            message = exc.message if isinstance(exc, InvalidArgument) else f"could not launch workers: {exc}"
            return self._finish(FAILED, message, 0)
        self.pgid, self.record = self._proc.pgid, self._proc.record
        self._on_spawn(self)
        log.info("assignment %s: started %s: %s", a.assignment_id, self._proc.label, " ".join(cmd))
        await self._await_start(self._proc)
        with open(self.run_dir / "worker.log", "a", buffering=1) as logfile:
            pumps = [
                asyncio.create_task(self._pump(self._proc.stdout, "stdout", logfile)),
                asyncio.create_task(self._pump(self._proc.stderr, "stderr", logfile)),
            ]
            stopper = None
            if self._stop is not None:  # asked to stop while the process was being spawned
                stopper = asyncio.create_task(self.stop(self._stop[1], self._stop[0]))
            guard = self._start_disk_guard()
            code = await self._proc.wait()
            if stopper is not None:
                await stopper
            await self._end_disk_guard(guard)
            # The keeper exits only once the whole tree is gone: nothing holds the pipes now.
            _, pending = await asyncio.wait(pumps, timeout=5)
            for task in pending:
                task.cancel()
        if self._over_quota:  # give the node its disk back: what the task wrote goes
            await asyncio.to_thread(free_task_dirs, self._quota_dirs, keep=AGENT_FILES)
        self.flush_metrics(force=True)
        if self._stop is not None:
            state, message = self._stop
        elif self._not_started is not None:
            state, message = FAILED, self._not_started
        elif self._proc.end_cause is not None:  # the scheduler ended it, not the workers
            state, message = FAILED, self._proc.end_cause
        elif code == 0 and self._preempt is not None and (self._result or {}).get("preempted"):
            step = (self._result or {}).get("checkpoint_step")
            where = f"checkpoint of step {step}" if step else "no checkpoint"
            state, message = CANCELLED, f"preempted ({self._preempt}): stopped with a {where}"
        elif code == 0:  # a preempted run that finished its last step first has succeeded
            state, message = SUCCEEDED, "workers exited cleanly"
        else:
            state, message = FAILED, self._failure(code)
        state, message = await self._upload(state, message, config)
        self._finish(state, message, code)

    def _failure(self, code: int) -> str:
        """Why the workers failed. A failed collective (a timeout, an NCCL error) is named as such,
        whatever rank's traceback came last, and NCCL's own log joins the task's log."""
        collective = collective_failure(self._collective_lines)
        if collective:
            for line in debug_tail(self.run_dir):
                self._forward("agent", line)
        why = collective or self._error or (self._stderr_tail[-1] if self._stderr_tail else "")
        suffix = " after reporting a result" if self._result is not None else ""
        return f"workers exited with code {code}{suffix}: {why}".rstrip(": ")

    def _nccl(self) -> dict[str, str]:
        s = self._settings
        return nccl_env(
            self.run_dir,
            socket_ifname=s.nccl_socket_ifname,
            ib_hca=s.nccl_ib_hca,
            timeout_s=s.nccl_timeout_s,
            debug=s.nccl_debug,
        )

    def _start_within(self) -> float | None:
        """The quote's limit on the task's queue wait (``start_within_s``); None: no limit."""
        limit = self.assignment.worker_config.get("start_within_s")
        if isinstance(limit, int | float) and 0 < limit <= MAX_TIME_LIMIT_S:
            return float(limit)
        return None

    def _shape(self) -> TaskShape:
        a = self.assignment
        limit = a.worker_config.get("time_limit_s")
        return TaskShape(
            name=a.assignment_id,
            nproc=a.nproc,
            gpus=len(a.device_indices) if self._device_kind == "cuda" else 0,
            # The quote's (``time_limit_s``); NaN and infinity fail both bounds.
            time_limit_s=float(limit)
            if isinstance(limit, int | float) and 0 < limit <= MAX_TIME_LIMIT_S
            else DEFAULT_TIME_LIMIT_S,
        )

    async def _await_start(self, proc: Launched) -> None:
        """Report RUNNING once the workers run: at once on this node; under a scheduler, once it
        starts the job (until then the task stays STARTING, queued). Training time, and the
        worker's start-up figures, count from there."""
        if self._launcher.name != "local":
            expected = self._launcher.queue_wait_s  # as the quote saw it, near enough
            self._report(agent_pb2.TASK_STATE_STARTING, f"queued as {proc.label}")
            within = self._start_within()
            try:
                if not await asyncio.wait_for(proc.started(), within):
                    return
            except TimeoutError:
                # Past the quote's wait and its tolerance: lost here, re-placed elsewhere.
                self._not_started = (
                    f"{proc.label} did not start within {within:g}s (the quoted queue wait's tolerance)"
                )
                proc.terminate()
                return
            now = time.monotonic()
            # Submit to start, against what was expected: calibration learns the cluster's wait.
            started = ""
            if self._spawned_at is not None:
                self._extra["queue_wait_s"] = round(now - self._spawned_at, 3)
                self._extra["queue_wait_estimate_s"] = round(expected, 3)
                # Told with RUNNING: calibration learns the wait at the start, not the job's end.
                started = json.dumps({k: self._extra[k] for k in ("queue_wait_s", "queue_wait_estimate_s")})
            self._spawned_at = now
            self._report(agent_pb2.TASK_STATE_RUNNING, proc.label, result_json=started)
            return
        self._report(agent_pb2.TASK_STATE_RUNNING, proc.label)

    def _http_verify(self) -> ssl.SSLContext | bool:
        return http_verify(self._settings.tls_ca_file)

    def _plain_hosts(self) -> frozenset[str]:
        return plain_http_hosts(self._settings.server, self._settings.tls_ca_file)

    def _stage_spec(self) -> StageSpec | None:
        raw = self.assignment.worker_config.get("stage")
        if raw is None:
            return None
        try:
            return StageSpec.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise InvalidArgument(f"worker_config.stage.{where}: {err['msg']}", field="stage") from None

    async def _stage(self) -> bool:
        """Bring the task's code, venv and data (``worker_config.stage``), telling the control
        plane how far it got. False when the task ended here (failed or stopped): its workers
        never start, so it is never charged for training time (that begins at RUNNING)."""
        try:
            stage = self._stage_spec()
        except InvalidArgument as exc:
            self._finish(FAILED, exc.message, 0)
            return False
        if stage is None:
            return True
        loop = asyncio.get_running_loop()

        def progress(message: str) -> None:
            loop.call_soon_threadsafe(self._staging_progress, message)

        def log_line(line: str) -> None:
            loop.call_soon_threadsafe(self._forward, "agent", line)

        try:
            self._staged = await asyncio.to_thread(
                staging.stage_task,
                stage,
                self._settings,
                progress=progress,
                log_line=log_line,
                cancel=self._stage_cancel,
            )
        except Cancelled:
            state, reason = self._stop or (CANCELLED, "stopped while staging")
            self._finish(state, reason, 0)
            return False
        except staging.StagingError as exc:
            self._forward("agent", f"[cpn-agent] staging failed: {exc.message}")
            self._finish(FAILED, f"staging failed: {exc.message}", 0)
            return False
        # one item per staged part (code, venv, data), as calibration and the benchmarks read it
        self._extra["staging"] = {
            "items": [f | {"kind": k} for k, f in self._staged.figures.items()],
            "seconds": round(self._staged.seconds, 6),
        }
        if self._stop is not None:
            self._finish(*self._stop, 0)
            return False
        return True

    def _staging_progress(self, message: str) -> None:
        if self.done:
            return
        self._report(agent_pb2.TASK_STATE_STARTING, message)
        self._forward("agent", f"[cpn-agent] {message}")

    async def _upload(self, state: int, message: str, config: dict[str, Any]) -> tuple[int, str]:
        """The task's outputs after its workers exited: the files they wrote after a success, the
        newest checkpoint after a failure or a cancel (where the stage names a target for it).
        A failed upload fails the task."""
        stage = self._stage_spec() if "stage" in self.assignment.worker_config else None
        if stage is None or not stage.outputs:
            return state, message
        outputs_dir = config.get("outputs_dir")
        try:
            if state == SUCCEEDED and isinstance(outputs_dir, str):
                done = await asyncio.to_thread(
                    uploads.upload_outputs,
                    Path(outputs_dir),
                    stage.outputs,
                    self._http_verify(),
                    self._plain_hosts(),
                )
                self._extra["outputs"] = done
            elif (
                state in (FAILED, CANCELLED)
                and CHECKPOINT_OUTPUT in stage.outputs
                and self._checkpoint_dir is not None
            ):
                done = await asyncio.to_thread(
                    uploads.upload_checkpoint,
                    self._checkpoint_dir,
                    stage.outputs[CHECKPOINT_OUTPUT],
                    self.run_dir,
                    self._http_verify(),
                    self._plain_hosts(),
                )
                if done is not None:
                    self._extra["outputs"] = {"uploaded": {CHECKPOINT_OUTPUT: done}, "missing": []}
        except (uploads.UploadError, OSError) as exc:
            self._forward("agent", f"[cpn-agent] {exc}")
            if state == SUCCEEDED:
                return FAILED, f"workers exited cleanly, but {exc}"
            return state, f"{message}; {exc}"
        return state, message

    def _start_disk_guard(self) -> asyncio.Task[None] | None:
        if not self._quota_dirs:
            return None
        quota, every = disk_quota_bytes(self._settings), self._settings.disk_check_interval_s
        return asyncio.create_task(guard_disk(self._quota_dirs, quota, self._stop_over_quota, every))

    async def _stop_over_quota(self, reason: str) -> None:
        self._over_quota = True
        await self.stop(reason, FAILED)

    async def _end_disk_guard(self, guard: asyncio.Task[None] | None) -> None:
        """Stop watching; a task that went over its quota between the last check and its exit
        fails all the same."""
        if guard is None:
            return
        guard.cancel()
        await asyncio.gather(guard, return_exceptions=True)
        if self._stop is None:
            used = await asyncio.to_thread(tree_bytes, self._quota_dirs)
            if (reason := over_quota_reason(used, disk_quota_bytes(self._settings))) is not None:
                self._stop, self._over_quota = (FAILED, reason), True

    async def _fetch_checkpoint(self) -> None:
        """Bring the checkpoint the control plane named (``checkpoint.fetch``) from the node of the
        region that holds a copy, before the workers start and look for it. A failed fetch is
        reported and the workers start anyway: they take the job's model from its peers, as they
        would with no checkpoint at all."""
        ck = self.assignment.worker_config.get("checkpoint")
        spec = ck.get("fetch") if isinstance(ck, dict) else None
        if not isinstance(spec, dict):
            return
        try:
            ticket = CheckpointTicket(
                str(spec["transfer_id"]),
                str(spec["source_node_id"]),
                str(spec["dir"]),
                int(spec["step"]),
                int(spec["max_bytes"]),
                float(spec["expires_at"]),
                str(spec["mac"]),
            )
            host, port = str(spec["host"]), int(spec["port"])
        except (KeyError, TypeError, ValueError) as exc:
            nbytes, seconds, error = 0, 0.0, f"checkpoint.fetch is malformed: {exc}"
        else:
            if has_checkpoint(self._settings.work_dir, ticket.dir, ticket.step):
                nbytes, seconds, error = 0, 0.0, ""  # already here (a copy landed before)
            else:
                tls = CheckpointTls.from_dict(ck.get("tls"))  # the job's, as the source serves it with
                nbytes, seconds, error = await run_copy(self._settings.work_dir, ticket, host, port, tls)
        aid = self.assignment.assignment_id
        if error:
            log.warning("assignment %s: checkpoint fetch failed: %s", aid, error)
        self._send(
            agent_pb2.AgentMessage(
                checkpoint_copy_result=agent_pb2.CheckpointCopyResult(
                    transfer_id=str(spec.get("transfer_id", "")),
                    bytes=nbytes,
                    duration_s=seconds,
                    error=error,
                    assignment_id=aid,
                )
            )
        )

    def _finish(self, state: int, message: str, code: int) -> None:
        now = time.monotonic()
        if self._result is not None and self._spawned_at is not None:
            # What the node adds to the worker's own timings: from the result to the group gone
            # (process-group teardown, interpreter exit), and the task's whole span.
            self._result["task_wall_s"] = now - self._spawned_at
            if self._result_at is not None:
                self._result["teardown_s"] = now - self._result_at
        merged = (self._result or {}) | self._extra if self._result is not None or self._extra else None
        result = json.dumps(merged, sort_keys=True) if merged is not None else ""
        if self._staged is not None:
            self._staged.use.release()  # its blobs may be evicted from now on
        if self.run_dir.is_dir():  # the provider's retention counts from here (``agent.cleanup``)
            (self.run_dir / ENDED_MARK).touch()
        # The scheduler took it away (preempted, node failed, out of time): lost, not failed.
        lost = self._stop is None and (
            self._not_started is not None or (self._proc is not None and self._proc.lost)
        )
        self._report(state, message, code, result, lost)
        self.finished_at = time.monotonic()
        log.info(
            "assignment %s: %s (%s)", self.assignment.assignment_id, agent_pb2.TaskState.Name(state), message
        )

    async def preempt(self, reason: str, grace_s: float) -> None:
        """Ask the workers to checkpoint their current step and exit; cancel them (``stop``) if
        they are still running ``grace_s`` later. Before the workers start, the same as ``stop``."""
        if self.done or self._stop is not None or self._preempt is not None:
            return
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return await self.stop(f"preempted ({reason}) before the workers started")
        self._preempt = reason
        try:
            self.preempt_path.write_text(reason)
        except OSError as exc:
            return await self.stop(f"preempted ({reason}); could not ask the workers to stop: {exc}")
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), grace_s)
        except TimeoutError:
            aid = self.assignment.assignment_id
            log.warning("assignment %s: still running %.0fs after preemption", aid, grace_s)
            await self.stop(f"preempted ({reason}); the workers did not stop within {grace_s:g}s")

    async def stop(self, reason: str, state: int = CANCELLED) -> None:
        """SIGTERM the tree, SIGKILL it after the grace period; ``run`` reports ``state``. The
        keeper does both (it alone reaches ranks that torchrun started in sessions of their own);
        the agent steps in only if the keeper itself is still there well after the grace."""
        if self.done:
            return
        if self._stop is None:
            self._stop = (state, reason)
        self._stage_cancel.set()
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), self._settings.kill_grace_s + KEEPER_SLACK_S)
        except TimeoutError:
            log.warning(
                "assignment %s: %s still running %.0fs after SIGTERM; killing it",
                self.assignment.assignment_id,
                proc.label,
                self._settings.kill_grace_s + KEEPER_SLACK_S,
            )
            proc.kill()

    async def _pump(self, stream: asyncio.StreamReader | None, name: str, logfile: Any) -> None:
        assert stream is not None
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line over READ_LIMIT: asyncio has discarded it
                logfile.write(f"[{name}] [cpn-agent: a line over {READ_LIMIT} bytes was dropped]\n")
                continue
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            logfile.write(f"[{name}] {line}\n")
            self._line(name, line)

    def _line(self, stream: str, line: str) -> None:
        if (payload := parse_prefixed(line, METRIC_PREFIX)) is not None:
            self._metrics.update(payload)
            self._metrics_pending = True
            self.flush_metrics()
            return
        if (payload := parse_prefixed(line, RESULT_PREFIX)) is not None:
            self._result = payload
            self._result_at = time.monotonic()
            return
        if line.startswith(ERROR_PREFIX):
            self._error = line[len(ERROR_PREFIX) :]
        if stream == "stderr" and line.strip():
            self._stderr_tail.append(line[:500])
            if is_collective_line(line):
                self._collective_lines.append(line[:1000])
        self._forward(stream, line)

    def _forward(self, stream: str, line: str) -> None:
        """One line to the job's logs, within the line budget."""
        forward, dropped = self._budget.admit(time.monotonic())
        if not forward:
            return
        aid = self.assignment.assignment_id
        if dropped:
            note = f"[cpn-agent] {dropped} lines dropped; all output is in {self.run_dir / 'worker.log'}"
            self._send(
                agent_pb2.AgentMessage(log=agent_pb2.TaskLog(assignment_id=aid, stream="agent", line=note))
            )
        self._send(
            agent_pb2.AgentMessage(
                log=agent_pb2.TaskLog(assignment_id=aid, stream=stream, line=line[:MAX_LINE])
            )
        )

    def latest_metrics(self) -> agent_pb2.AgentMessage | None:
        """The newest metrics as a message (None before the first), to send or to replay."""
        if self._metrics.latest is None:
            return None
        return agent_pb2.AgentMessage(
            metrics=agent_pb2.TaskMetrics(assignment_id=self.assignment.assignment_id, **self._metrics.latest)
        )

    def flush_metrics(self, force: bool = False) -> None:
        """Send the newest metrics if some are waiting and the interval allows (or ``force``)."""
        message = self.latest_metrics()
        if not self._metrics_pending or message is None:
            return
        now = time.monotonic()
        if not force and now - self._metrics_sent_at < self._settings.metrics_min_interval_s:
            return
        self._metrics_pending, self._metrics_sent_at = False, now
        self._send(message)
