"""A task with users' code, data and outputs, from assignment to final state: the agent's
``WorkerRun`` staging against a real HTTP server on loopback, real worker processes, uploads."""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from agent import cleanup
from agent.sandbox import task_paths
from agent.settings import AgentSettings
from agent.staging import Staged, apply_stage, progress_message
from agent.workers import CANCELLED, FAILED, SUCCEEDED, Assignment, WorkerRun
from contracts.artifacts import CHECKPOINT_OUTPUT, MODEL_CONFIG_OUTPUT, MODEL_OUTPUT
from proto.cpn.agent.v1 import agent_pb2
from tests.agent.fake_store import FakeStore, digest

RUNNING = agent_pb2.TASK_STATE_RUNNING


@pytest.fixture
def store() -> Iterator[FakeStore]:
    s = FakeStore().start()
    yield s
    s.stop()


def agent_settings(tmp: Path, **kw: Any) -> AgentSettings:
    defaults: dict[str, Any] = {
        "server": "127.0.0.1:1",
        "region": "eu-west",
        "cluster": "c0",
        "price_per_device_hour": 1.0,
        "work_dir": tmp / "work",
        "allow_command_override": True,
        "pip_args": ("--no-index", "--find-links", str(tmp / "no-wheels")),
    }
    return AgentSettings(**(defaults | kw))


def run_task(
    config: dict[str, Any], settings: AgentSettings, nproc: int = 1
) -> tuple[WorkerRun, list[agent_pb2.AgentMessage]]:
    sent: list[agent_pb2.AgentMessage] = []
    a = Assignment("a1", "j1", 1, (), nproc, config)
    run = WorkerRun(
        a,
        settings.work_dir.resolve() / "assignments" / "a1",
        settings=settings,
        device_kind="cpu",
        send=sent.append,
    )
    asyncio.run(run.run())
    return run, sent


def statuses(sent: list[agent_pb2.AgentMessage]) -> list[agent_pb2.TaskStatus]:
    return [m.task_status for m in sent if m.WhichOneof("kind") == "task_status"]


def agent_log(sent: list[agent_pb2.AgentMessage]) -> list[str]:
    return [m.log.line for m in sent if m.WhichOneof("kind") == "log" and m.log.stream == "agent"]


def final(sent: list[agent_pb2.AgentMessage]) -> tuple[agent_pb2.TaskStatus, dict[str, Any]]:
    last = statuses(sent)[-1]
    return last, json.loads(last.result_json) if last.result_json else {}


def code_archive(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# A command standing in for torchrun: writes into outputs_dir (and a checkpoint), then exits.
WRITER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    cfg = json.loads(Path(os.environ["CPN_WORKER_CONFIG"]).read_text())
    Path(os.environ["CPN_WORKER_CONFIG"]).with_name("ran").write_text(sys.executable)
    out = Path(cfg["outputs_dir"])
    (out / "model.safetensors").write_bytes(b"weights" * 1000)
    (out / "config.json").write_text('{"final_loss": 0.5}')
    (out / "scratch.bin").write_bytes(b"not an output")
    step = Path(cfg["checkpoint"]["dir"]) / "step_00000002"
    step.mkdir(parents=True)
    (step / "shard.distcp").write_bytes(b"shard")
    (step / "COMPLETE").write_text("2")
    Path(cfg["checkpoint"]["dir"], "step_00000003").mkdir()  # interrupted: never uploaded
    print('CPN_RESULT {"final_loss": 0.5, "steps": 3}', flush=True)
    sys.exit(int(sys.argv[1]))
    """
)


def writer_config(store: FakeStore, exit_code: int, **stage: Any) -> dict[str, Any]:
    outputs = {
        name: {"url": store.output_url(name), "max_bytes": 1 << 20}
        for name in (MODEL_OUTPUT, MODEL_CONFIG_OUTPUT, CHECKPOINT_OUTPUT)
    }
    return {
        "job_id": "j1",
        "checkpoint": {"dir": "checkpoints/j1/c0"},
        "command": ["python", "-c", WRITER, str(exit_code)],
        "stage": {"outputs": outputs, "sandbox": False, **stage},
    }


def test_outputs_are_uploaded_after_the_workers_succeed(store: FakeStore, tmp_path: Path) -> None:
    run, sent = run_task(writer_config(store, 0), agent_settings(tmp_path))
    status, result = final(sent)
    assert status.state == SUCCEEDED, status.message
    assert store.uploads[MODEL_OUTPUT] == b"weights" * 1000
    assert json.loads(store.uploads[MODEL_CONFIG_OUTPUT]) == {"final_loss": 0.5}
    assert set(store.uploads) == {MODEL_OUTPUT, MODEL_CONFIG_OUTPUT}  # no checkpoint after a success
    up = result["outputs"]["uploaded"]
    assert up[MODEL_OUTPUT] | {"seconds": 0} == {
        "bytes": 7000,
        "digest": digest(b"weights" * 1000),
        "seconds": 0,
    }
    assert result["final_loss"] == 0.5  # the worker's own result, merged
    assert (run.run_dir / "ended").exists()


def test_a_refused_upload_fails_the_task(store: FakeStore, tmp_path: Path) -> None:
    store.refuse_puts = 403
    _, sent = run_task(writer_config(store, 0), agent_settings(tmp_path))
    status, _ = final(sent)
    assert status.state == FAILED
    assert "workers exited cleanly, but output config.json: upload failed: HTTP 403" in status.message


def test_an_output_url_in_the_clear_to_another_host_is_refused_before_any_byte(
    store: FakeStore, tmp_path: Path
) -> None:
    # The agent speaks to its control plane at 10.0.0.1: a plain-http output URL elsewhere (a wrong
    # CPN_PUBLIC_URL) would carry the ticket and the model's bytes in the clear.
    _, sent = run_task(writer_config(store, 0), agent_settings(tmp_path, server="10.0.0.1:1"))
    status, _ = final(sent)
    assert status.state == FAILED
    assert "refusing to upload to http://127.0.0.1" in status.message
    assert not store.uploads and not [r for r in store.requests if r.method == "PUT"]


def test_a_failed_task_leaves_its_newest_complete_checkpoint_downloadable(
    store: FakeStore, tmp_path: Path
) -> None:
    _, sent = run_task(writer_config(store, 3), agent_settings(tmp_path))
    status, result = final(sent)
    assert status.state == FAILED and status.exit_code == 3
    assert set(store.uploads) == {CHECKPOINT_OUTPUT}
    with tarfile.open(fileobj=io.BytesIO(store.uploads[CHECKPOINT_OUTPUT])) as tar:
        assert sorted(tar.getnames()) == ["step_00000002/COMPLETE", "step_00000002/shard.distcp"]
    assert result["outputs"]["uploaded"][CHECKPOINT_OUTPUT]["step_dir"] == "step_00000002"


def test_pip_failure_fails_the_task_with_pips_lines_and_no_worker_starts(
    store: FakeStore, tmp_path: Path
) -> None:
    requirements = "surely-no-such-package-cpn==1.0\n"
    archive = code_archive({"requirements.txt": requirements, "userjob/__init__.py": ""})
    store.blobs["code"] = archive
    config = writer_config(
        store,
        0,
        code={"url": store.blob_url("code"), "digest": digest(archive), "bytes": len(archive)},
        requirements_digest=digest(requirements.encode()),
    )
    run, sent = run_task(config, agent_settings(tmp_path))
    status, _ = final(sent)
    assert status.state == FAILED
    assert status.message.startswith("staging failed: pip install failed")
    assert "surely-no-such-package-cpn" in status.message
    assert any("No matching distribution" in line or "Could not find" in line for line in agent_log(sent))
    assert RUNNING not in [s.state for s in statuses(sent)]  # never charged: metering starts at RUNNING
    assert not (run.run_dir / "ran").exists() and not store.uploads


def test_a_resident_shard_of_another_region_is_refused_before_any_fetch(
    store: FakeStore, tmp_path: Path
) -> None:
    store.blobs["shard"] = b"us data"
    config = writer_config(
        store, 0, data={"url": store.blob_url("shard"), "digest": digest(b"us data"), "region": "us-east"}
    )
    run, sent = run_task(config, agent_settings(tmp_path))
    status, _ = final(sent)
    assert status.state == FAILED
    assert "resident shard of region 'us-east'" in status.message and "'eu-west'" in status.message
    assert store.requests == [] and not (run.run_dir / "ran").exists()


def test_staging_reports_progress_and_a_second_task_hits_the_cache(store: FakeStore, tmp_path: Path) -> None:
    data = bytes(range(256)) * 8000
    store.blobs["shard"] = data
    config = writer_config(
        store, 0, data={"url": store.blob_url("shard"), "digest": digest(data), "bytes": len(data)}
    )
    settings = agent_settings(tmp_path)
    run, sent = run_task(config, settings)
    status, result = final(sent)
    assert status.state == SUCCEEDED, status.message
    starting = [s.message for s in statuses(sent) if s.state == agent_pb2.TASK_STATE_STARTING]
    assert "staging data 100% (2.0 of 2.0 MB)" in starting
    staged = {i["kind"]: i for i in result["staging"]["items"]}
    assert staged["data"]["cache_hit"] is False and staged["data"]["bytes"] == len(data)
    staged_path = json.loads((run.run_dir / "worker_config.json").read_text())["data"]["path"]
    assert Path(staged_path).read_bytes() == data
    n = len(store.requests)
    _, sent = run_task(config | {"job_id": "j1"}, settings)
    _, result = final(sent)
    assert {i["kind"]: i for i in result["staging"]["items"]}["data"]["cache_hit"] is True
    assert [r for r in store.requests[n:] if r.method == "GET"] == []


def test_a_cancel_while_staging_ends_the_task_cancelled(store: FakeStore, tmp_path: Path) -> None:
    requirements = "# only the node's packages\n"
    archive = code_archive({"requirements.txt": requirements})
    store.blobs["code"] = archive
    config = writer_config(
        store,
        0,
        code={"url": store.blob_url("code"), "digest": digest(archive)},
        requirements_digest=digest(requirements.encode()),
    )
    sent: list[agent_pb2.AgentMessage] = []
    settings = agent_settings(tmp_path)

    async def scenario() -> WorkerRun:
        run = WorkerRun(
            Assignment("a1", "j1", 1, (), 1, config),
            settings.work_dir.resolve() / "assignments" / "a1",
            settings=settings,
            device_kind="cpu",
            send=sent.append,
        )
        task = asyncio.create_task(run.run())
        while not any("staging venv" in s.message for s in statuses(sent)):
            await asyncio.sleep(0.01)
        await run.stop("user cancelled")
        await task
        return run

    run = asyncio.run(scenario())
    status, _ = final(sent)
    assert (status.state, status.message) == (CANCELLED, "user cancelled")
    assert not (run.run_dir / "ran").exists()


def test_a_malformed_stage_fails_the_task_naming_the_field(tmp_path: Path) -> None:
    _, sent = run_task({"job_id": "j1", "stage": {"code": {"url": ""}}}, agent_settings(tmp_path))
    status, _ = final(sent)
    assert status.state == FAILED and status.message.startswith("worker_config.stage.code.url:")


def test_the_config_points_at_what_was_staged_and_the_sandbox_sees_only_that(tmp_path: Path) -> None:
    staged = Staged(code_dir=tmp_path / "code", venv=tmp_path / "venv", data_path=tmp_path / "shard")
    run_dir = tmp_path / "run"
    config = apply_stage(
        {
            "data": {"kind": "tokens", "path": "x"},
            "stage": {"outputs": {"model.safetensors": {}}},
            "checkpoint": {"dir": str(tmp_path / "ck")},
        },
        staged,
        run_dir,
    )
    assert config["data"] == {"kind": "tokens", "path": str(tmp_path / "shard")}
    assert config["outputs_dir"] == str(run_dir / "outputs")
    # What the sandbox then sees follows from that config, the workers' path and interpreter.
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "pyvenv.cfg").touch()
    env = {"PYTHONPATH": str(tmp_path / "code")}
    writable, readable = task_paths(config, run_dir, [str(tmp_path / "venv" / "bin" / "python")], env)
    assert writable == [run_dir, tmp_path / "ck", run_dir / "outputs"]
    assert readable == [tmp_path / "shard", tmp_path / "code", tmp_path / "venv"]
    assert progress_message("data", 12_300_000, 27_100_000) == "staging data 45% (12.3 of 27.1 MB)"


def test_retention_deletes_a_jobs_dirs_only_when_none_of_its_tasks_runs_and_the_time_is_up(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    for aid, job in (("a1", "j1"), ("a2", "j2")):
        d = work / "assignments" / aid
        d.mkdir(parents=True)
        (d / "worker_config.json").write_text(json.dumps({"job_id": job}))
        (d / "ended").touch()
        (work / "checkpoints" / job / "c0").mkdir(parents=True)
    now = time.time()
    for path in (work / "assignments" / "a1" / "ended", work / "checkpoints" / "j1"):
        os.utime(path, (now - 7200, now - 7200))
    assert cleanup.clean(work, {"j1"}, 3600, now) == []  # j1 runs here again: kept
    assert cleanup.clean(work, set(), 3600, now) == ["j1"]
    assert not (work / "checkpoints" / "j1").exists() and not (work / "assignments" / "a1").exists()
    assert (work / "checkpoints" / "j2").exists() and (work / "assignments" / "a2").exists()


BYO = textwrap.dedent(
    """
    import numpy as np
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from training.byo import BYOJob


    def make_model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 2))


    def datasets(path):
        raw = torch.from_numpy(np.fromfile(path, dtype=np.float32).reshape(-1, 10).copy())
        x, y = raw[:, :8], raw[:, 8:]
        return TensorDataset(x[:384], y[:384]), TensorDataset(x[384:], y[384:])


    def build(cfg):
        import sys
        from pathlib import Path

        Path("interpreter.txt").write_text(sys.executable)  # the cwd is the task's own directory
        train, held_out = datasets(cfg.data.path)
        return BYOJob(make_model(), train, nn.functional.mse_loss, eval_dataset=held_out)
    """
)


def test_a_users_code_and_data_train_and_the_model_lands_in_the_store(
    store: FakeStore, tmp_path: Path
) -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(512, 8, generator=gen)
    y = x @ torch.randn(8, 2, generator=gen)
    data = torch.cat([x, y], dim=1).numpy().astype(np.float32).tobytes()
    requirements = "# the node's torch is enough\n"
    archive = code_archive(
        {"userjob/__init__.py": "", "userjob/train.py": BYO, "requirements.txt": requirements}
    )
    store.blobs.update(code=archive, data=data)
    outputs = {
        n: {"url": store.output_url(n), "max_bytes": 1 << 24} for n in (MODEL_OUTPUT, MODEL_CONFIG_OUTPUT)
    }
    config = {
        "job_id": "j1",
        "region": "eu-west",
        "cluster": "c0",
        "entrypoint": "userjob.train:build",
        "data": {"kind": "byo", "seed": 1},
        "training": {"steps": 30, "local_batch": 32, "lr": 3e-2, "warmup": 0},
        "device": "cpu",
        "checkpoint": {"dir": "checkpoints/j1/c0"},
        "stage": {
            "code": {"url": store.blob_url("code"), "digest": digest(archive), "bytes": len(archive)},
            "requirements_digest": digest(requirements.encode()),
            "data": {"url": store.blob_url("data"), "digest": digest(data), "bytes": len(data)},
            "outputs": outputs,
            "sandbox": False,
        },
    }
    settings = agent_settings(tmp_path).model_copy(update={"allow_command_override": False})
    run, sent = run_task(config, settings)
    status, result = final(sent)
    assert status.state == SUCCEEDED, (status.message, (run.run_dir / "worker.log").read_text()[-3000:])
    assert result["steps"] == 30
    venv = Path((run.run_dir / "interpreter.txt").read_text()).parent.parent
    assert venv.parent == settings.work_dir.resolve() / "cache" / "venvs"  # the venv's python ran it
    staged = {i["kind"]: i for i in result["staging"]["items"]}
    assert staged["venv"]["cache_hit"] is False
    assert set(staged) == {"code", "venv", "data"}
    assert result["outputs"]["uploaded"][MODEL_OUTPUT]["digest"] == digest(store.uploads[MODEL_OUTPUT])
    meta = json.loads(store.uploads[MODEL_CONFIG_OUTPUT])
    assert meta["entrypoint"] == "userjob.train:build" and meta["final_loss"] == result["final_loss"]
    # The uploaded model, reloaded from its bytes alone, reproduces the eval loss the worker reported.
    weights = tmp_path / "downloaded.safetensors"
    weights.write_bytes(store.uploads[MODEL_OUTPUT])
    namespace: dict[str, Any] = {}
    exec(compile(BYO, "userjob/train.py", "exec"), namespace)  # noqa: S102 - the test's own code
    model = namespace["make_model"]()
    model.load_state_dict(load_file(str(weights)))
    raw = np.frombuffer(data, dtype=np.float32).reshape(-1, 10)
    hx, hy = torch.from_numpy(raw[384:, :8].copy()), torch.from_numpy(raw[384:, 8:].copy())
    batch = meta["eval"]["batch_size"]
    with torch.no_grad():
        losses = [
            float(torch.nn.functional.mse_loss(model(hx[i : i + batch]), hy[i : i + batch]))
            * len(hx[i : i + batch])
            for i in range(0, len(hx), batch)
        ]
    assert abs(sum(losses) / len(hx) - result["eval_loss"]) < 1e-4
    assert result["eval_loss"] == meta["eval_loss"]
