"""A user's own job on real parts: ``examples/byo`` packed and uploaded with its three regions'
shards (each resident), placed over REST on three real agents (sandboxed workers), trained with
DiLoCo; the model downloaded, loaded into the example's own class and evaluated here to the loss
the worker reported; then the same job again, which stages nothing and is quoted so: the agents'
staging probes priced the first quote, their cache reports the second."""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service_layer.cli.demo import wait_for_clusters
from service_layer.cli.local_fleet import LocalAgent, enroll, start_agents, stop_agents
from service_layer.client import CpnClient
from service_layer.code_archive import pack_code
from service_layer.server import ServerHandle, start_server_in_thread
from tests.conftest import (
    create_postgres_database,
    drop_postgres_database,
    postgres_unreachable,
    redis_unreachable,
    settings_for,
)
from tests.integration.links import declare_links, wait_links_measured

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "byo"
REGIONS = ("eu-west", "us-east", "ap-south")
TERMINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[ServerHandle, CpnClient]]:
    for reason in (postgres_unreachable(), redis_unreachable()):
        if reason:
            pytest.skip(reason)
    url = create_postgres_database()
    admin_key = "cpn_admin_" + secrets.token_urlsafe(16)
    settings = settings_for(
        url, data_dir=tmp_path / "cp", http_port=0, grpc_port=0, admin_api_key=admin_key,
        heartbeat_interval_s=1.0, heartbeat_misses=5, link_probe_tick_s=0.5,
    )  # fmt: skip
    handle = start_server_in_thread(settings)
    client = CpnClient(handle.http_url, admin_key)
    specs = [
        LocalAgent(
            r, f"{r}-c0", f"p-{r}", 1.0 + i / 10, devices="cpu:1", measure_profile=False, probe_staging=True
        )
        for i, r in enumerate(REGIONS)
    ]
    procs: list[Any] = []
    try:
        tokens = enroll(client._http, specs, note="byo")
        procs = start_agents(specs, handle.grpc_target, tokens, tmp_path / "agents", first_port=31400)
        wait_for_clusters(client._http, len(specs))
        declare_links(client._http, list(REGIONS), latency_ms=0.1)
        wait_links_measured(client._http, list(REGIONS))
        wait_staging_measured(client)
        yield handle, client
    finally:
        stop_agents(procs)
        client.close()
        handle.stop()
        drop_postgres_database(url)


def wait_staging_measured(client: CpnClient, timeout_s: float = 120) -> None:
    """Until every agent reported its staging probe (it fetches it right after registering)."""
    deadline = time.monotonic() + timeout_s
    while not all(n["staging"] for c in client.clusters() for n in c["nodes"]):
        assert time.monotonic() < deadline, "the agents' staging probes never arrived"
        time.sleep(0.5)


def staging_reads(client: CpnClient, spec: dict[str, Any]) -> list[dict[str, Any]]:
    option = min(client.quote(spec)["options"], key=lambda o: o["estimates"]["cost"]["total"])
    return option["estimates"]["staging"]["reads"]


def example() -> tuple[Any, Any, Any]:
    sys.path.insert(0, str(EXAMPLE))
    try:
        import corpus  # noqa: PLC0415
        import model  # noqa: PLC0415
        import train  # noqa: PLC0415
    finally:
        sys.path.remove(str(EXAMPLE))
    return corpus, model, train


def held_out_loss(model: Any, dataset: Any, loss_fn: Any, batch_size: int) -> float:
    """The downloaded model's mean loss over the held-out windows, in the worker's batches (as its
    result states them), computed here on its own."""
    import torch  # noqa: PLC0415

    total, n = 0.0, len(dataset)
    with torch.no_grad():
        for start in range(0, n, batch_size):
            xs, ys = zip(*(dataset[i] for i in range(start, min(n, start + batch_size))), strict=True)
            total += float(loss_fn(model(torch.stack(xs)), torch.stack(ys))) * len(xs)
    return total / n


def wait(client: CpnClient, job_id: str, timeout_s: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (job := client.job(job_id))["status"] not in TERMINAL:
        assert time.monotonic() < deadline, f"job still {job['status']}"
        time.sleep(0.5)
    return job


def test_users_code_and_resident_shards_train_and_the_model_comes_home(
    fleet: tuple[ServerHandle, CpnClient], tmp_path: Path
) -> None:
    from safetensors.torch import load_file  # noqa: PLC0415

    _, client = fleet
    corpus, model_mod, train = example()
    shards = corpus.write_shards(tmp_path / "shards")
    packed = pack_code(EXAMPLE, tmp_path / "code.tar.gz", exclude=("shards/*",))
    code = client.upload_artifact(packed.path, kind="code")
    digests = {r: client.upload_artifact(p, kind="data")["digest"] for r, p in shards.items()}
    spec = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    spec["training"] |= {"steps": 40, "warmup_steps": 5}
    spec["sync"] = {"mode": "diloco", "every": 10}
    spec["code"] = {"digest": code["digest"], "requirements_digest": packed.requirements_digest}
    spec["data"] = {"shards": {r: {"uri": f"artifact:{d}", "resident": True} for r, d in digests.items()}}

    runs, quoted = [], []
    for _ in range(2):
        quoted.append(staging_reads(client, spec))
        job = wait(client, client.submit(spec=spec, choice="cheapest")["id"])
        assert job["status"] == "succeeded", job["reason"]
        runs.append(job)
    # Before any staging, each node is priced at what its agent measured: two fetches and a venv.
    for read in quoted[0]:
        assert (read["rate_basis"], read["fixed_basis"], read["venv_basis"]) == ("measured",) * 3
        assert read["fetches"] == 2 and read["cached"] == [] and read["seconds"] > 0
    # After it, the nodes' caches hold the code, their shards and the venv: nothing to stage.
    for read in quoted[1]:
        assert read["cached"] == ["code", f"data.shards.{read['region']}", "venv"], read
        assert (read["fetches"], read["bytes"], read["seconds"]) == (0, 0, 0.0)

    first, second = runs
    assert {t["region"] for t in first["tasks"]} == set(REGIONS)  # a replica where each shard lives
    per_task = first["result"]["per_task"]
    staged = [i for r in per_task.values() for i in (r.get("staging") or {}).get("items", [])]
    by_region = {r["region"]: r for r in per_task.values()}
    for region, result in by_region.items():  # each region read its own shard, no other
        data = [i for i in (result.get("staging") or {}).get("items", []) if i["kind"] == "data"]
        assert [i["digest"] for i in data] == [digests[region]], result.get("staging")
    assert staged and not any(i["cache_hit"] for i in staged if i["kind"] == "data")
    assert all(r["staging"]["seconds"] > 0 for r in per_task.values())  # the whole staging, timed
    again = [i for r in second["result"]["per_task"].values() for i in r["staging"]["items"]]
    assert {i["kind"] for i in again} >= {"code", "data"} and all(i["cache_hit"] for i in again), again

    reported = [r for r in per_task.values() if r.get("eval_loss") is not None]
    assert reported, per_task
    outputs = {a["name"]: a for a in client.job_artifacts(first["id"])}
    assert {"model.safetensors", "config.json"} <= set(outputs), outputs
    dest = client.download_artifact(outputs["model.safetensors"], tmp_path / "model.safetensors")
    model = model_mod.CharModel(train.CONFIG)
    model.load_state_dict(load_file(str(dest)))
    batch = reported[0]["eval"]["batch_size"]
    local = held_out_loss(model.eval(), train.eval_dataset(), train.lm_loss, batch)
    assert abs(local - reported[0]["eval_loss"]) <= 1e-4, (local, reported[0]["eval_loss"])
    assert local < 4.0  # it learned: uniform over 128 symbols is ln 128 = 4.85
