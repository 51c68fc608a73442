"""A guard around ``ast.parse`` for CPython 3.11 before 3.11.8 (gh-106905, this image's 3.11.7).

The interpreter keeps the AST constructor's recursion depth in state shared by every thread; a
thread switch inside one ``ast.parse`` (a finalizer run by an allocation) that lets another thread
parse leaves the first with ``SystemError: AST constructor recursion depth mismatch``. The tests
run servers in threads beside Hypothesis, which parses lambdas' source to describe strategies.
Parses in this process take turns (reentrant: a finalizer may parse on the same thread), and a
parse that met the mismatch anyway (a caller bypassing ``ast.parse``) runs once more: each call
starts the count afresh.
"""

from __future__ import annotations

import ast
import functools
import sys
import threading
from typing import Any

MISMATCH = "AST constructor recursion depth mismatch"


def install() -> None:
    if sys.version_info >= (3, 11, 8) or getattr(ast.parse, "_cpn_guarded", False):
        return
    parse = ast.parse
    lock = threading.RLock()

    @functools.wraps(parse)
    def guarded(*args: Any, **kw: Any) -> Any:
        with lock:
            try:
                return parse(*args, **kw)
            except SystemError as e:
                if MISMATCH not in str(e):
                    raise
                return parse(*args, **kw)

    guarded._cpn_guarded = True  # type: ignore[attr-defined]
    ast.parse = guarded
