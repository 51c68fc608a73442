"""Per-task stage sections: signed code and data URLs per region, the resident shard of each
region, output URLs only on the task that holds the final model."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from contracts.artifacts import ArtifactTicket, verify_ticket
from contracts.errors import FailedPrecondition
from control_layer.stage_sections import CHECKPOINT_FILE, CONFIG_FILE, MODEL_FILE, job_stage
from control_layer.user_data import MemoryArtifacts, resolve_refs
from control_layer.worker_config import build_worker_configs, validate_worker_config
from orchestration.artifacts.urls import artifact_key
from orchestration.settings import Settings
from tests.control_layer.test_worker_config import _fleet, _slots
from tests.orchestration.fleet import hand_option, tiny_spec

CODE = "sha256:" + "c" * 64
EU_SHARD = "sha256:" + "e" * 64
NOW = 1_800_000_000.0
SETTINGS = Settings(public_url="https://cp.example.org")


def _refs(spec, artifacts: MemoryArtifacts):
    return resolve_refs(
        spec,
        "t1",
        regions={"eu-west", "us-east", "ap-south"},
        artifacts=artifacts,
        s3=None,
        head=lambda u, t: 7,
    )


def _user_spec(**data):
    return tiny_spec(
        training={"steps": 4, "global_batch_tokens": 48},  # 3 sequences: one per replica
        entrypoint="train:build",
        code={"digest": CODE, "requirements_digest": "sha256:" + "d" * 64},
        data={"kind": "tokens", **data},
        outputs={"checkpoint": True},
    )


def _ticket(url: str) -> ArtifactTicket:
    return ArtifactTicket.decode(parse_qs(urlsplit(url).query)["ticket"][0])


def test_each_task_gets_code_its_regions_shard_and_one_gets_the_outputs() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0), (c["eu"], n["eu2"], 0)])
    spec = _user_spec(
        shards={
            "eu-west": {"uri": f"artifact:{EU_SHARD}", "resident": True},
            "us-east": {"uri": "https://data.example.org/us.bin", "resident": False, "sha256": CODE},
        }
    )
    store = MemoryArtifacts()
    store.add("t1", CODE, 1234)
    store.add("t1", EU_SHARD, 10**9)
    stage = job_stage(
        spec, _refs(spec, store), job_id="job", settings=SETTINGS, now=NOW, regions=["eu-west", "us-east"]
    )
    configs = build_worker_configs("job", spec, option, _slots(option, c), stage=stage)
    assert len(configs) == 3
    key = artifact_key(SETTINGS)
    holders = []
    for node_id, cfg in configs.items():
        validate_worker_config(cfg)
        st = cfg["stage"]
        assert st["sandbox"] is True and st["requirements_digest"] == "sha256:" + "d" * 64
        assert st["code"]["digest"] == CODE and st["code"]["bytes"] == 1234
        assert st["code"]["url"].startswith("https://cp.example.org/v1/artifacts/content/" + CODE)
        verify_ticket(key, _ticket(st["code"]["url"]), action="get", target=CODE, now=NOW + 1)
        region = next(s.region for s in _slots(option, c) if s.node_id == node_id)
        if region == "eu-west":  # its resident shard, marked with its region, from the store
            assert st["data"]["region"] == "eu-west" and st["data"]["digest"] == EU_SHARD
            assert st["data"]["bytes"] == 10**9
            verify_ticket(key, _ticket(st["data"]["url"]), action="get", target=EU_SHARD, now=NOW + 1)
        else:  # a non-resident https shard goes as it is, with the digest it must match
            assert st["data"] == {
                "url": "https://data.example.org/us.bin",
                "digest": CODE,
                "bytes": 7,
                "region": None,
            }
        assert cfg["data"]["kind"] == "byo" and cfg["data"]["path"] is None  # the agent sets it
        if st["outputs"]:
            holders.append(node_id)
    # Only the leader of the group holding replica 0 uploads the final model (and the checkpoint).
    assert holders == [n["eu"].id]
    outputs = configs[n["eu"].id]["stage"]["outputs"]
    assert set(outputs) == {MODEL_FILE, CONFIG_FILE, CHECKPOINT_FILE}
    for name, target in outputs.items():
        ticket = _ticket(target["url"])
        verify_ticket(key, ticket, action="put", target=name, now=NOW + 1)
        assert ticket.max_bytes == target["max_bytes"] and f"/v1/jobs/job/outputs/{name}" in target["url"]


def test_a_source_reaches_every_task_and_tokens_train_on_the_staged_file() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0)])
    spec = tiny_spec(data={"kind": "tokens", "source": "file:///data/tokens.bin"})
    stage = job_stage(
        spec,
        _refs(spec, MemoryArtifacts()),
        job_id="job",
        settings=SETTINGS,
        now=NOW,
        regions=["eu-west", "us-east"],
    )
    configs = build_worker_configs("job", spec, option, _slots(option, c), stage=stage)
    for cfg in configs.values():
        parsed = validate_worker_config(cfg)  # tokens without a path: stage.data brings it
        assert parsed["data"]["kind"] == "tokens" and parsed["data"]["path"] is None
        assert cfg["stage"]["data"] == {
            "url": "file:///data/tokens.bin",
            "digest": None,
            "bytes": None,
            "region": None,
        }
        assert cfg["stage"]["code"] is None and cfg["stage"]["sandbox"] is False
    assert [bool(cfg["stage"]["outputs"]) for cfg in configs.values()].count(True) == 1
    assert set(configs[n["eu"].id]["stage"]["outputs"]) == {MODEL_FILE, CONFIG_FILE}  # no checkpoint asked


def test_a_job_bringing_nothing_gets_no_stage_section() -> None:
    spec = tiny_spec()
    assert (
        job_stage(spec, _refs(spec, MemoryArtifacts()), job_id="j", settings=SETTINGS, now=NOW, regions=[])
        is None
    )


def test_s3_data_needs_a_store_to_presign() -> None:
    spec = tiny_spec(data={"kind": "tokens", "source": "s3://bucket-a/tokens.bin"})

    class Store:
        bucket = "bucket-a"

        def tenant_prefix(self, tenant_id: str) -> str:
            return f"tenants/{tenant_id}/"

        def object_size(self, bucket: str, key: str) -> int | None:
            return 99 if (bucket, key) == ("bucket-a", "tokens.bin") else None

        def presign_external(self, bucket: str, key: str) -> str:
            return f"https://s3.example.org/{bucket}/{key}?X-Amz-Signature=abc"

    refs = resolve_refs(spec, "t1", regions={"eu-west"}, artifacts=None, s3=Store())
    args = dict(job_id="j", settings=SETTINGS, now=NOW, regions=["eu-west"])
    stage = job_stage(spec, refs, presign=Store().presign_external, **args)
    assert stage.section("eu-west", final=False)["data"]["url"].startswith("https://s3.example.org/bucket-a/")
    assert stage.section("eu-west", final=False)["data"]["bytes"] == 99
    with pytest.raises(FailedPrecondition, match="no S3 store"):
        job_stage(spec, refs, presign=None, **args)
