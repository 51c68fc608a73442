"""A real one-node Slurm on this machine, for the tests: ``munged`` with a key of its own,
``slurmctld`` and ``slurmd -N localhost`` from a generated ``slurm.conf``, everything under one
directory. No systemd or cgroups: processes are tracked through /proc (``proctrack/linuxproc``)
and tasks are not bound (``task/none``). Clients find the cluster through ``SLURM_CONF``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.processes import free_port

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
NODE_CPUS = 8
START_TIMEOUT_S = 30.0


def missing_reason() -> str | None:
    """None when a Slurm can be started here, else why not."""
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return f"Slurm or munge not installed (missing {', '.join(absent)}): apt-get install slurm-wlm munge"
    if os.geteuid() != 0:
        return "starting munged as the munge user and slurmd needs root"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no munge user (the munge package creates it)"
    return None


def slurm_conf(root: Path, ctld_port: int, slurmd_port: int, munge_socket: Path) -> str:
    return f"""\
ClusterName=cpntest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.txt
MinJobAge=600
KillWait=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs={NODE_CPUS} RealMemory={NODE_CPUS * 1024} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    """A running one-node Slurm; ``env`` is what a client needs to reach it."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(self, *argv: str, check: bool = True) -> str:
        """A Slurm command against this cluster; its stdout."""
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def start(self) -> None:
        for sub in ("state", "spool", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        munge_dir = self.root / "munge"
        munge_socket = munge_dir / "munge.socket"
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        user = pwd.getpwnam("munge")
        for path in (munge_dir, key):
            os.chown(path, user.pw_uid, user.pw_gid)
        key.chmod(0o400)
        munge_dir.chmod(0o755)  # the socket in it must be reachable by all
        # munged checks that no one but its user can write the dirs above its files.
        self.root.chmod(0o755)
        conf = self.root / "slurm.conf"
        conf.write_text(slurm_conf(self.root, free_port(), free_port(), munge_socket))
        self.env = {**os.environ, "SLURM_CONF": str(conf)}
        self._spawn(
            "munged",
            "--foreground",
            f"--socket={munge_socket}",
            f"--key-file={key}",
            f"--pid-file={munge_dir}/munged.pid",
            f"--log-file={munge_dir}/munged.log",
            f"--seed-file={munge_dir}/munged.seed",
            user="munge",
        )
        self._wait(munge_socket.exists, "munged's socket")
        self._spawn("slurmctld", "-D", "-i", "-f", str(conf))
        self._spawn("slurmd", "-D", "-N", "localhost", "-f", str(conf))
        self._wait(self._node_up, "the node to come up")

    def _spawn(self, *argv: str, user: str | None = None) -> None:
        log = open(self.root / f"{argv[0]}.out", "ab")  # noqa: SIM115 (lives as long as the daemon)
        # The user through setpriv, not Popen(user=): with a uid to set Python forks instead of
        # vforking, the fork runs gRPC's atfork handlers in the child, and they crash it (SIGSEGV,
        # before the exec) when another thread of this test process is inside gRPC.
        as_user = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"] if user else []
        proc = subprocess.Popen(
            [*as_user, *argv], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.procs.append(proc)

    def _node_up(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%T", check=False).strip()
        return out.rstrip("*") in ("idle", "mixed", "allocated")

    def _wait(self, ready: object, what: str) -> None:
        assert callable(ready)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}: {self._logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm: timed out waiting for {what}: {self._logs()}")
            time.sleep(0.1)

    def _logs(self) -> str:
        tails = []
        for name in ("munged.out", "slurmctld.out", "slurmd.out", "slurmctld.log", "slurmd.log"):
            with contextlib.suppress(OSError):
                tails.append(f"--- {name}\n" + "\n".join((self.root / name).read_text().splitlines()[-15:]))
        return "\n".join(tails)

    def stop(self) -> None:
        """Cancel every job, stop the daemons (slurmd first: it ends the job steps it runs), and
        wait until each is gone; SIGKILL whatever is left of their sessions."""
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "--user=root", check=False)
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.procs.clear()
        self._end_job_leftovers()

    def _end_job_leftovers(self) -> None:
        """SIGKILL any process a job of this cluster left (``proctrack/linuxproc`` follows parent
        links, so a child whose parent died first escapes it): every process whose environment
        names this cluster's configuration, which Slurm passes to each job it runs."""
        mark = f"SLURM_CONF={self.env.get('SLURM_CONF', '')}".encode()
        for environ in Path("/proc").glob("[0-9]*/environ"):
            pid = int(environ.parent.name)
            if pid == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if mark in environ.read_bytes().split(b"\0"):
                    os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def running_slurm() -> Iterator[SlurmCluster]:
    """A started cluster under a fresh directory of /tmp (pytest's own is private to root, and
    munged, running as its user, must reach its files), stopped and removed on exit."""
    root = Path(tempfile.mkdtemp(prefix="cpn-slurm-"))
    cluster = SlurmCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
