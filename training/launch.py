"""torchrun, as every node's tasks start: ``python -m training.launch [torchrun's arguments]``.

Two things differ from ``python -m torch.distributed.run``:

- The authenticated rendezvous is registered (``training.rendezvous``), for a group spanning nodes:

      python -m training.launch --nnodes 2 --rdzv-backend cpn-tls --rdzv-endpoint HEAD:PORT \\
          --rdzv-id JOB --rdzv-conf rank=R --nproc-per-node N -m training.worker --config cfg.json

  with ``CPN_WORKER_CONFIG`` naming the worker config whose ``group`` holds the job's credentials.
- Ranks of ``-m training.worker`` are forked from one process that imported the worker once
  (torchrun's ``forkserver`` start method over a function entrypoint), where torchrun would start
  a fresh interpreter per rank that imports torch and the trainer again: about 2 CPU-seconds a
  rank on a 2-core host, and on an 8-device node eight imports at once fighting for the cores.
  Any other command runs exactly as torchrun runs it.

Everything else is torchrun's (``torch.distributed.run``).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import tempfile
import uuid
from argparse import Namespace

import torch.multiprocessing
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.launcher.api import elastic_launch

from training.rank import rank_main
from training.rendezvous import register

WORKER_MODULE = "training.worker"
# The fork server listens on <tempdir>/pymp-XXXXXXXX/listener-XXXXXXXX; a socket's path holds at
# most 107 bytes on Linux.
SOCKET_PATH_MAX = 107
LISTENER_SUFFIX = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
SHORT_TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def forks_the_worker(args: Namespace) -> bool:
    return bool(args.module) and not args.no_python and args.training_script == WORKER_MODULE


def _rendezvous_defaults(args: Namespace) -> None:
    """What ``torch.distributed.run.run`` fills in before it builds the launch config."""
    if args.standalone:
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    elif args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None:
        _, max_nodes = torchrun.parse_min_max_nnodes(args.nnodes)
        if max_nodes == 1:
            args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500


def short_socket_dir() -> None:
    """Where the task's TMPDIR is too long for the fork server's socket (a deep work directory),
    make multiprocessing's own temp directory under a short system one instead; Python 3.11 would
    fail the launch with ``AF_UNIX path too long``. The directory is removed at exit as usual."""
    if len(tempfile.gettempdir()) + LISTENER_SUFFIX <= SOCKET_PATH_MAX:
        return
    for base in SHORT_TEMP_DIRS:
        if os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK):
            saved, tempfile.tempdir = tempfile.tempdir, base
            try:
                multiprocessing.util.get_temp_dir()  # created here, kept for the process's life
            finally:
                tempfile.tempdir = saved
            return


def run_forked(args: Namespace) -> None:
    """torchrun's run, with ``training.worker``'s ranks forked from a process that preloaded it."""
    torch.multiprocessing._set_thread_name("pt_elastic")
    _rendezvous_defaults(args)
    config, _, _ = torchrun.config_from_args(args)  # sets OMP_NUM_THREADS first where torchrun does
    config.start_method = "forkserver"
    # The fork server starts with this environment: the ranks' output unbuffered, as `python -u`.
    os.environ["PYTHONUNBUFFERED"] = "1"
    short_socket_dir()
    multiprocessing.set_forkserver_preload([WORKER_MODULE])
    elastic_launch(config=config, entrypoint=rank_main)(list(args.training_script_args))


@record
def main(argv: list[str] | None = None) -> None:
    register()
    args = torchrun.parse_args(argv)
    if forks_the_worker(args):
        run_forked(args)
    else:
        torchrun.run(args)


if __name__ == "__main__":
    main()
