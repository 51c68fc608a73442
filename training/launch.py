"""torchrun with the authenticated rendezvous registered (``training.rendezvous``):

    python -m training.launch --nnodes 2 --rdzv-backend cpn-tls --rdzv-endpoint HEAD:PORT \\
        --rdzv-id JOB --rdzv-conf rank=R --nproc-per-node N -m training.worker --config cfg.json

with ``CPN_WORKER_CONFIG`` naming the worker config whose ``group`` holds the job's credentials.
Everything else is torchrun's (``torch.distributed.run``).
"""

from __future__ import annotations

from torch.distributed.run import main as torchrun

from training.rendezvous import register


def main(argv: list[str] | None = None) -> None:
    register()
    torchrun(argv)


if __name__ == "__main__":
    main()
