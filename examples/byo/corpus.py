"""The example's text: docstrings of Python's standard library, needing no download.

Each module's docstrings go to one of three regions (by module, so each region's text differs in
kind, as real regional data does); every tenth docstring is held out for evaluation. The same
Python version gives the same bytes everywhere.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

REGIONS = ("eu-west", "us-east", "ap-south")
# Modules whose import has no side effects, spread over the library's kinds of text.
MODULES = (
    "argparse", "ast", "base64", "bisect", "calendar", "collections", "contextlib", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "email.message", "enum", "fractions", "functools", "gzip",
    "hashlib", "heapq", "hmac", "html", "http.client", "inspect", "io", "ipaddress", "itertools", "json",
    "logging", "math", "operator", "os", "pathlib", "pickle", "pprint", "queue", "random", "re",
    "shlex", "shutil", "socket", "sqlite3", "statistics", "string", "struct", "subprocess", "tarfile",
    "tempfile", "textwrap", "threading", "time", "tokenize", "typing", "unittest", "urllib.parse",
    "uuid", "warnings", "weakref", "zipfile", "zlib",
)  # fmt: skip


def _docstrings(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    docs = [inspect.getdoc(module) or ""]
    for name in sorted(vars(module)):
        obj = getattr(module, name)
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj) or inspect.isfunction(obj):
            docs.append(inspect.getdoc(obj) or "")
        if inspect.isclass(obj):  # and its own methods'
            docs += [inspect.getdoc(m) or "" for k, m in sorted(vars(obj).items()) if inspect.isfunction(m)]
    return [d.encode("ascii", "ignore").decode() for d in docs if len(d) >= 40]


def split() -> tuple[dict[str, str], str]:
    """(region -> training text, held-out text)."""
    shards: dict[str, list[str]] = {r: [] for r in REGIONS}
    held: list[str] = []
    n = 0
    for i, module in enumerate(MODULES):
        for doc in _docstrings(module):
            n += 1
            (held if n % 10 == 0 else shards[REGIONS[i % len(REGIONS)]]).append(doc)
    return {r: "\n\n".join(d) for r, d in shards.items()}, "\n\n".join(held)


def heldout_text() -> str:
    return split()[1]


def write_shards(out_dir: Path) -> dict[str, Path]:
    """One file per region (ASCII bytes) and ``heldout.txt``; returns region -> file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shards, held = split()
    paths = {}
    for region, text in shards.items():
        paths[region] = out_dir / f"{region}.txt"
        paths[region].write_bytes(text.encode())
    (out_dir / "heldout.txt").write_bytes(held.encode())
    return paths


if __name__ == "__main__":
    import sys

    for region, path in write_shards(Path(sys.argv[1] if len(sys.argv) > 1 else "shards")).items():
        print(f"{region}: {path} ({path.stat().st_size} bytes)")
