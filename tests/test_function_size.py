"""No product function is longer than MAX_LINES or keeps more than MAX_LOCALS names.

Product code is every Python file outside tests/, benchmarks/ and database migrations. A
function's length runs from its ``def`` line to its last line (decorators left out); its locals
are its parameters and every name its body binds (assignments, loop and ``with`` targets,
comprehension variables, ``except ... as``, imports, nested ``def``/``class`` names), leaving out
names declared ``global`` or ``nonlocal`` and whatever nested functions, classes and lambdas bind
inside themselves. Pure and fast: the files are parsed, nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 120
MAX_LOCALS = 40
NOT_PRODUCT = {"tests", "benchmarks", "migrations"}
NOT_SOURCE = {"__pycache__", "node_modules", "build", "dist"}  # and hidden or *.egg-info folders

Function = ast.FunctionDef | ast.AsyncFunctionDef


def product_files(root: Path = ROOT) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts[:-1]
        if any(
            p in NOT_PRODUCT or p in NOT_SOURCE or p.startswith(".") or p.endswith(".egg-info") or "venv" in p
            for p in parts
        ):
            continue
        yield path


def local_names(fn: Function) -> set[str]:
    """The parameters of ``fn`` and the names its own body binds (see the module doc)."""
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]
    names = {p.arg for p in params}
    declared: set[str] = set()
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)  # the nested body is its own scope; its decorators are ours
            stack.extend(node.decorator_list)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Global | ast.Nonlocal):
            declared.update(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        stack.extend(ast.iter_child_nodes(node))
    return names - declared


def oversized(root: Path = ROOT) -> list[str]:
    """``path:line name: N lines, M locals`` for every product function over either limit."""
    found = []
    for path in product_files(root):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            assert node.end_lineno is not None
            lines, n_locals = node.end_lineno - node.lineno + 1, len(local_names(node))
            if lines > MAX_LINES or n_locals > MAX_LOCALS:
                where = path.relative_to(root).as_posix()
                found.append(f"{where}:{node.lineno} {node.name}: {lines} lines, {n_locals} locals")
    return found


def test_no_product_function_is_too_long_or_keeps_too_many_locals() -> None:
    assert oversized() == [], f"over {MAX_LINES} lines or {MAX_LOCALS} locals: split into named steps"


def test_the_count_takes_what_a_function_binds_and_leaves_nested_scopes_alone() -> None:
    source = """
def f(a, /, b, *args, c, **kw):
    global g
    g = 1
    x, (y, z) = 1, (2, 3)
    for i in range(3):
        pass
    with open("p") as fh:
        pass
    try:
        pass
    except OSError as exc:
        pass
    import os.path
    from json import loads as parse
    total = sum(v for v in args)
    if (w := 2):
        pass
    fn = lambda q: q
    def inner(d):
        e = d
    class K:
        attr = 1
"""
    (fn,) = ast.parse(source).body
    assert isinstance(fn, ast.FunctionDef)
    assert local_names(fn) == {
        "a", "b", "args", "c", "kw", "x", "y", "z", "i", "fh", "exc", "os", "parse", "total", "v",
        "w", "fn", "inner", "K",
    }  # fmt: skip


def test_the_scan_finds_an_oversized_function_and_skips_tests(tmp_path: Path) -> None:
    body = "\n".join(f"    v{i} = {i}" for i in range(MAX_LOCALS + 1))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(f"def big():\n{body}\n\n\ndef small():\n    return 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(f"def big():\n{body}\n")
    long = "\n".join("    pass" for _ in range(MAX_LINES))
    (tmp_path / "pkg" / "long.py").write_text(f"def long():\n{long}\n")
    assert oversized(tmp_path) == [
        f"pkg/long.py:1 long: {MAX_LINES + 1} lines, 0 locals",
        f"pkg/mod.py:1 big: {MAX_LOCALS + 2} lines, {MAX_LOCALS + 1} locals",
    ]
