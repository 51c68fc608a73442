"""The function ``training.launch`` starts each rank of ``training.worker`` with (pickled by
reference to the fork server, so its module must stay light: the worker itself is preloaded there)."""

from __future__ import annotations


def rank_main(argv: list[str]) -> None:
    """One rank: the exit status ``training.worker`` would have given as a process of its own."""
    from training.worker import main

    code = main(argv)
    if code:
        raise SystemExit(code)
