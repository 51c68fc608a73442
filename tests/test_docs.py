"""What the documents name exists: repository paths, tests, modules, commands and `cpn` commands.

Scans README.md, BENCHMARKS.md and docs/*.md. Checked, each by its own pattern:
- backticked repository paths (`control_layer/planner/estimate.py`, `benchmarks/sim/`), with an
  optional test (`tests/x/test_y.py::test_z`, `::TestClass::test_z`), found by parsing the file;
- backticked test names (`test_...`): a test function of that name under tests/;
- backticked dotted names under a package (`control_layer.preemption.preempt_job`): the module,
  and the first name after it defined there;
- commands, in backticks or fenced code blocks: `python benchmarks/x.py` (the file),
  `python -m pkg.mod` (the module), `bash scripts/x.sh` (the script), and `cpn <command>
  [<subcommand>] [--option ...]` against the CLI's own command tree;
- relative links (`[text](docs/api.md#a-heading)`): the file, and the heading in it.
Skipped: URLs, globs, placeholders (`<JOB>`, `{id}`, `$VAR`), absolute paths and paths outside the
repository (a node's work dir, /tmp). Pure and fast: no services, no subprocesses.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer.main

from cpn.cli import app as cli_app

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "agent", "benchmarks", "contracts", "control_layer", "cpn", "orchestration", "proto",
    "resource_layer", "service_layer", "tests", "training",
)  # fmt: skip
PATH_SUFFIXES = (".py", ".md", ".yml", ".yaml", ".toml", ".proto", ".sh", ".json", ".txt")
# Benchmarks a document lists before they exist: each only on a row marked "not yet run".
PLANNED = {"benchmarks/byo_job.py": "not yet run"}

FENCE = re.compile(r"^\s*```")
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(r"^\.?/?((?:[\w.-]+/)+[\w.-]*)((?:::[\w]+)*)(?:\[[^\]]*\])?$")
TOP_FILE = re.compile(r"^[\w.-]+\.(?:md|toml)$")
TEST_NAME = re.compile(r"^test_\w+$")
DOTTED = re.compile(rf"^((?:{'|'.join(p for p in PACKAGES if p != 'cpn')})(?:\.\w+)+)(?:\(\))?$")
# `training.precision` is also the job spec's field: a dotted `training.x` counts only as a module.
SPEC_SECTIONS = {"training"}
PYTHON = re.compile(r"\bpython3?\s+(?:-m\s+([\w.]+)|((?:\./)?[\w./-]+\.py)\b)")
BASH = re.compile(r"\bbash\s+([\w./-]+\.sh)\b")
CPN = re.compile(r"(?:^|(?<=[\s;|&(`]))cpn((?:\s+[^\s;|&#)`]+)*)")
SKIP = re.compile(r"://|[*<>{}$…]|\.\.\.")


@dataclass(frozen=True)
class Ref:
    line: int
    kind: str  # path | test | dotted | python | module | bash | cpn | link
    text: str


def _joined_fenced_lines(lines: list[str]) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, inside a fenced block), a fenced line ending in a backslash joined to
    the next, as the shell reads it."""
    fenced = False
    pending: tuple[int, str] | None = None
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            start, text = pending if pending else (number, "")
            text += line
            if line.rstrip().endswith("\\"):
                pending = (start, text.rstrip()[:-1] + " ")
                continue
            pending = None
            yield start, text, True
        else:
            yield number, line, False


def _commands(number: int, text: str) -> Iterator[Ref]:
    for m in PYTHON.finditer(text):
        if m.group(1):
            yield Ref(number, "module", m.group(1))
        else:
            yield Ref(number, "python", m.group(2))
    for m in BASH.finditer(text):
        yield Ref(number, "bash", m.group(1))
    for m in CPN.finditer(text):
        yield Ref(number, "cpn", "cpn" + m.group(1).split("#")[0].rstrip())


def _is_path(span: str) -> bool:
    """A repository path: a file with a known suffix, a folder (a trailing slash), or anything
    under one of the packages; never a flag (`--nnodes/--node-rank`) or a field
    (`nodes.fabric_bandwidth_gbps/fabric_latency_ms`)."""
    if TOP_FILE.match(span):
        return True
    m = PATH.match(span)
    if m is None or span.startswith("-"):
        return False
    path = m.group(1)
    first = path.split("/")[0]
    if "." in first:
        return False
    return path.endswith(PATH_SUFFIXES) or path.endswith("/") or first in PACKAGES


def references(text: str) -> list[Ref]:
    """Everything a document names that ``problems`` checks."""
    refs: list[Ref] = []
    for number, line, fenced in _joined_fenced_lines(text.splitlines()):
        if fenced:
            refs += _commands(number, line.split(" #")[0])
            continue
        for m in LINK.finditer(line):
            if "://" not in m.group(1) and not m.group(1).startswith("mailto:"):
                refs.append(Ref(number, "link", m.group(1)))
        for m in SPAN.finditer(line):
            span = m.group(1).strip()
            refs += _commands(number, span)
            if SKIP.search(span) or " " in span or span.startswith("/"):
                continue
            if _is_path(span):
                refs.append(Ref(number, "path", span))
            elif TEST_NAME.match(span):
                refs.append(Ref(number, "test", span))
            elif DOTTED.match(span):
                refs.append(Ref(number, "dotted", DOTTED.match(span).group(1)))  # type: ignore[union-attr]
    return refs


@cache
def _defined(path: Path) -> frozenset[str]:
    """Names a Python file defines: top-level functions, classes and assignments, imports, and
    ``Class::method`` for methods."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}::{item.name}")
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


@cache
def _test_functions(root: Path) -> frozenset[str]:
    found: set[str] = set()
    for path in (root / "tests").rglob("test_*.py"):
        found.add(path.stem)
        found |= {n.split("::")[-1] for n in _defined(path) if n.split("::")[-1].startswith("test_")}
    return frozenset(found)


def _module_file(root: Path, dotted: str) -> Path | None:
    base = root.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py", base / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    lines = [line for _, line, fenced in _joined_fenced_lines(path.read_text().splitlines()) if not fenced]
    return {_slug(line.lstrip("#")) for line in lines if re.match(r"^#{1,6} ", line)}


def _check_cpn(cli: Any, command: str) -> str | None:
    try:
        argv = shlex.split(command)[1:]
    except ValueError:
        argv = command.split()[1:]
    node, path = cli, ["cpn"]
    while argv and hasattr(node, "commands") and not argv[0].startswith("-"):
        word = argv.pop(0)
        if word.startswith("<"):
            return None  # `cpn <command> --help`: a placeholder, not a command
        if word not in node.commands:
            return f"`{' '.join(path)}` has no command {word!r}"
        node, path = node.commands[word], [*path, word]
    if hasattr(node, "commands"):
        return None  # a group named alone (`cpn jobs`)
    options = {o for p in node.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    for word in argv:
        for flag in word.split("=")[0].split("/"):  # `--a/--b`: two flags named together
            if flag.startswith("-") and flag not in options and not re.fullmatch(r"-\d+(\.\d+)?", flag):
                return f"`{' '.join(path)}` has no option {flag}"
    return None


def problems(doc: Path, root: Path, cli: Any) -> list[str]:
    """Each reference of ``doc`` that names nothing in the repository, as 'doc:line: why'."""
    out: list[str] = []
    lines = doc.read_text().splitlines()
    for ref in references(doc.read_text()):
        why: str | None = None
        if ref.kind == "path":
            path, _, test = ref.text.partition("::")
            path = path.removeprefix("./")
            target = root / path
            if path in PLANNED and not target.exists():
                if PLANNED[path] not in lines[ref.line - 1]:
                    why = f"{path} not yet written: name it only on a {PLANNED[path]!r} row"
            elif not target.exists():
                why = f"no such path {path}"
            elif test:
                name = re.sub(r"\[.*\]$", "", test)
                if target.suffix != ".py" or name not in _defined(target):
                    why = f"{path} defines no {name}"
        elif ref.kind == "test":
            if ref.text not in _test_functions(root):
                why = f"no test or test file named {ref.text} under tests/"
        elif ref.kind == "dotted":
            parts = ref.text.split(".")
            for cut in range(len(parts), 0, -1):
                module = _module_file(root, ".".join(parts[:cut]))
                if module is not None:
                    if cut == 1 and parts[0] in SPEC_SECTIONS:
                        break
                    if cut < len(parts) and parts[cut] not in _defined(module):
                        why = f"{'.'.join(parts[:cut])} defines no {parts[cut]}"
                    break
            else:
                why = f"no module {ref.text}"
        elif ref.kind == "module":
            if ref.text.split(".")[0] in PACKAGES and _module_file(root, ref.text) is None:
                why = f"no module {ref.text}"
        elif ref.kind in ("python", "bash"):
            path = ref.text.removeprefix("./")
            if path in PLANNED and not (root / path).exists():
                if PLANNED[path] not in lines[ref.line - 1]:
                    why = f"{path} not yet written: name it only on a {PLANNED[path]!r} row"
            elif not (root / path).is_file():
                why = f"no such file {path}"
        elif ref.kind == "cpn":
            why = _check_cpn(cli, ref.text)
        elif ref.kind == "link":
            target, _, anchor = ref.text.partition("#")
            file = (doc.parent / target).resolve() if target else doc
            if not file.exists():
                why = f"link to a missing file {target}"
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                why = f"link to a missing heading {ref.text}"
        if why:
            out.append(f"{doc.relative_to(root) if doc.is_relative_to(root) else doc.name}:{ref.line}: {why}")
    return out


@cache
def _cli() -> Any:
    return typer.main.get_command(cli_app)  # typer's own click tree: groups carry .commands


DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_everything_a_document_names_exists(doc: Path) -> None:
    assert problems(doc, ROOT, _cli()) == []


FAKE = """# A document

See `control_layer/planner/estimate.py` and `control_layer/no_such_file.py`, the test
`tests/test_docs.py::test_everything_a_document_names_exists` and
`tests/test_docs.py::test_that_is_made_up`, the bare `test_the_scanner_finds_what_is_made_up` and
`test_nobody_wrote`, the module `control_layer.preemption.preempt_job` and
`control_layer.preemption.made_up`. A [link](README.md#quick-start), a [broken one](README.md#no-heading)
and [a missing file](docs/nothing.md). Skipped: `https://example.com/a.py`, `<work dir>/x.py`,
`/etc/cpn/ca.crt`, `tests/**/*.py`.

```bash
python benchmarks/planner.py --quotes 3   # exists
python benchmarks/made_up.py
python -m training.worker --config c.json
python -m training.made_up
bash scripts/test.sh
cpn jobs logs <JOB> -f
cpn jobs frobnicate <JOB>
cpn agent --server a:1 \\
  --no-such-flag
```

Planned: `benchmarks/byo_job.py` | not yet run |
Elsewhere: `python benchmarks/byo_job.py`.
"""


def test_the_scanner_finds_what_is_made_up(tmp_path: Path) -> None:
    doc = tmp_path / "FAKE.md"
    doc.write_text(FAKE)
    (tmp_path / "README.md").write_text("# Title\n\n## Quick start\n")
    found = problems(doc, ROOT, _cli())
    assert found == [
        "FAKE.md:3: no such path control_layer/no_such_file.py",
        "FAKE.md:5: tests/test_docs.py defines no test_that_is_made_up",
        "FAKE.md:6: no test or test file named test_nobody_wrote under tests/",
        "FAKE.md:7: link to a missing heading README.md#no-heading",
        "FAKE.md:7: control_layer.preemption defines no made_up",
        "FAKE.md:8: link to a missing file docs/nothing.md",
        "FAKE.md:13: no such file benchmarks/made_up.py",
        "FAKE.md:15: no module training.made_up",
        "FAKE.md:18: `cpn jobs` has no command 'frobnicate'",
        "FAKE.md:19: `cpn agent` has no option --no-such-flag",
    ] + (
        []
        if (ROOT / "benchmarks/byo_job.py").exists()
        else ["FAKE.md:24: benchmarks/byo_job.py not yet written: name it only on a 'not yet run' row"]
    )
