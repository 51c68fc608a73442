"""Before a task's workers start: its code, venv and data on the node (``worker_config.stage``).

``stage_task`` brings them (blocking; the agent runs it in a thread), ``apply_stage`` points the
worker's config at them, and ``code_pythonpath`` puts the code first on the workers' path. What
the workers may see under the node's sandbox follows from that config (``agent.sandbox.sandboxed``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import code_env
from agent.fetch import BlobUse, FetchError, fetch
from agent.settings import AgentSettings
from agent.tls import http_verify, plain_http_hosts
from contracts.artifacts import MAX_CODE_BYTES
from contracts.worker_config import StageSpec

OUTPUTS_DIR = "outputs"  # under the task's own directory


class StagingError(Exception):
    """Staging failed: the task fails with ``message`` and its workers never start."""

    def __init__(self, message: str, lines: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.lines = lines or []  # what the task's log should show (pip's last lines)


@dataclass
class Staged:
    code_dir: Path | None = None
    venv: Path | None = None
    data_path: Path | None = None
    figures: dict[str, Any] = field(default_factory=dict)  # per item: bytes, seconds, cache hit
    seconds: float = 0.0  # the whole staging, start to end: what the task's devices waited for
    use: BlobUse = field(default_factory=BlobUse)  # the blobs held while the task runs

    @property
    def python(self) -> str:
        """The interpreter the workers run under: the venv's, else the agent's own."""
        return str(code_env.venv_python(self.venv)) if self.venv is not None else sys.executable


def progress_message(what: str, done: int, total: int | None) -> str:
    """``staging data 45% (12.3 of 27.1 MB)``; without a known total, the bytes so far."""
    mb = done / 1e6
    if total:
        return f"staging {what} {min(100, int(100 * done / total))}% ({mb:.1f} of {total / 1e6:.1f} MB)"
    return f"staging {what} ({mb:.1f} MB)"


def region_problem(stage: StageSpec, region: str) -> str | None:
    """A resident shard is read only in its own region: the data never crosses one."""
    data = stage.data
    if data is not None and data.region is not None and data.region != region:
        return (
            f"stage.data is a resident shard of region {data.region!r}; this node is in {region!r}"
            " and may not read it"
        )
    return None


def stage_task(
    stage: StageSpec,
    settings: AgentSettings,
    *,
    progress: Callable[[str], None] = lambda message: None,
    log_line: Callable[[str], None] = lambda line: None,
    cancel: threading.Event | None = None,
) -> Staged:
    """Bring the task's code, venv and data; StagingError (or fetch.Cancelled) if it cannot."""
    if problem := region_problem(stage, settings.region):
        raise StagingError(problem)
    work = settings.work_dir.resolve()
    staged = Staged()
    started = time.monotonic()
    try:
        if stage.code is not None:
            item = stage.code
            got = fetch(
                item.url,
                work_dir=work,
                digest=item.digest,
                expected_bytes=item.bytes,
                max_bytes=MAX_CODE_BYTES,
                use=staged.use,
                progress=lambda d, t: progress(progress_message("code", d, t)),
                cancel=cancel,
                cache_max_bytes=settings.cache_max_bytes,
                verify=http_verify(settings.tls_ca_file),
                plain_http_hosts=plain_http_hosts(settings.server, settings.tls_ca_file),
            )
            t0 = time.monotonic()
            key = got.digest or item.digest
            assert key is not None  # a downloaded blob always has one
            staged.code_dir, unpacked = code_env.unpack_code(got.path, key, work)
            staged.figures["code"] = got.figures() | {
                "unpack_s": round(time.monotonic() - t0, 6),
                "unpacked_cache_hit": unpacked,
            }
        if stage.requirements_digest is not None:
            if staged.code_dir is None:
                raise StagingError("stage.requirements_digest is set without stage.code")
            progress("staging venv: pip install -r requirements.txt")
            t0 = time.monotonic()
            venv = code_env.ensure_venv(
                staged.code_dir,
                stage.requirements_digest,
                work,
                pip_args=settings.pip_args,
                timeout_s=settings.pip_timeout_s,
                on_line=log_line,
                cancel=cancel,
            )
            staged.venv = venv.path
            staged.figures["venv"] = {
                "seconds": round(time.monotonic() - t0, 6),
                "cache_hit": venv.cache_hit,
                "cpu_s": round(venv.cpu_s, 6),
                "digest": stage.requirements_digest,
            }
        if stage.data is not None:
            item = stage.data
            got = fetch(
                item.url,
                work_dir=work,
                digest=item.digest,
                expected_bytes=item.bytes,
                use=staged.use,
                progress=lambda d, t: progress(progress_message("data", d, t)),
                cancel=cancel,
                cache_max_bytes=settings.cache_max_bytes,
                verify=http_verify(settings.tls_ca_file),
                plain_http_hosts=plain_http_hosts(settings.server, settings.tls_ca_file),
            )
            staged.data_path = got.path
            staged.figures["data"] = got.figures()
    except code_env.PipFailed as exc:
        staged.use.release()
        raise StagingError(exc.message, exc.tail) from None
    except (FetchError, code_env.CodeError) as exc:
        staged.use.release()
        raise StagingError(str(exc)) from None
    except BaseException:
        staged.use.release()
        raise
    staged.seconds = time.monotonic() - started
    return staged


def apply_stage(config: dict[str, Any], staged: Staged | None, run_dir: Path) -> dict[str, Any]:
    """The worker's config pointing at what was staged: ``data.path`` at the staged file and, for
    a task with outputs to upload, ``outputs_dir`` in the task's own directory."""
    config = dict(config)
    if staged is not None and staged.data_path is not None:
        data = config.get("data") if isinstance(config.get("data"), dict) else {}
        config["data"] = data | {"path": str(staged.data_path)}
    stage = config.get("stage")
    if isinstance(stage, dict) and stage.get("outputs"):
        config["outputs_dir"] = str(run_dir / OUTPUTS_DIR)
    return config


def code_pythonpath(staged: Staged | None, current: str | None) -> str | None:
    """PYTHONPATH with the unpacked code in front (the entrypoint is imported from it)."""
    if staged is None or staged.code_dir is None:
        return current
    return str(staged.code_dir) + (f":{current}" if current else "")
