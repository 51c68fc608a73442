"""Each task's ``worker_config.stage``: signed URLs for the job's code and its region's data, and
upload URLs for the outputs on the one task that holds the final model.

Pure apart from the clock the caller passes: (spec, resolved references, settings) -> sections.
The task that holds the final model is the leader (node rank 0) of the group holding global
replica 0: every replica ends with the same model, and that node writes it (``outputs_dir``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contracts.artifacts import MAX_ARTIFACT_BYTES, DataUri
from contracts.errors import FailedPrecondition
from contracts.job_spec import JobSpec
from control_layer.user_data import ResolvedRef, ResolvedRefs, needs_resolution
from orchestration.artifacts.urls import get_url, put_url
from orchestration.settings import Settings

MODEL_FILE, CONFIG_FILE, CHECKPOINT_FILE = "model.safetensors", "config.json", "checkpoint.tar"
CONFIG_MAX_BYTES = 1 << 20  # the model's config.json

Presign = Callable[[str, str], str]  # (bucket, key) -> GET URL


@dataclass(frozen=True)
class JobStage:
    """The stage sections of one placement, per region (data) and for the final model's holder."""

    code: dict[str, Any] | None
    requirements_digest: str | None
    data_by_region: dict[str, dict[str, Any]]
    data_default: dict[str, Any] | None  # data.source: every region reads it
    outputs: dict[str, dict[str, Any]]
    sandbox: bool

    def section(self, region: str, *, final: bool) -> dict[str, Any]:
        """``contracts.worker_config.StageSpec`` of a task in ``region``; ``final``: it holds the
        final model and gets the output URLs."""
        return {
            "code": self.code,
            "requirements_digest": self.requirements_digest,
            "data": self.data_by_region.get(region, self.data_default),
            "outputs": dict(self.outputs) if final else {},
            "sandbox": self.sandbox,
        }


def shard_choice(spec: JobSpec, regions: list[str], chosen: dict[str, str] | None) -> dict[str, str]:
    """Per region used, the shard its tasks read: as the option priced it (``chosen``), else its
    own, else the first non-resident shard by name. A region with none is left out."""
    shards = spec.data.shards or {}
    open_ = sorted(r for r, s in shards.items() if not s.resident)
    out: dict[str, str] = {}
    for region in regions:
        pick = (chosen or {}).get(region)
        if pick is None:
            pick = region if region in shards else (open_[0] if open_ else None)
        if pick is not None:
            out[region] = pick
    return out


def job_stage(
    spec: JobSpec,
    refs: ResolvedRefs,
    *,
    job_id: str,
    settings: Settings,
    now: float,
    regions: list[str],
    shard_of_region: dict[str, str] | None = None,
    presign: Presign | None = None,
) -> JobStage | None:
    """The placement's stage sections; None for a job that brings no code or data and asks
    nothing of its outputs (the built-in model on generated data runs as before)."""
    if not (needs_resolution(spec) or spec.outputs.checkpoint):
        return None

    def item(ref: ResolvedRef, digest: str | None, region: str | None = None) -> dict[str, Any]:
        return {
            "url": _url(ref, job_id=job_id, settings=settings, now=now, presign=presign),
            "digest": digest,
            "bytes": ref.bytes,
            "region": region,
        }

    code = item(refs.code, spec.code.digest) if refs.code is not None and spec.code is not None else None
    by_region: dict[str, dict[str, Any]] = {}
    for region, name in shard_choice(spec, regions, shard_of_region).items():
        shard = (spec.data.shards or {})[name]
        ref = refs.shards[name]
        by_region[region] = item(ref, shard.sha256 or ref.uri.digest, name if shard.resident else None)
    default = (
        item(refs.source, spec.data.sha256 or refs.source.uri.digest) if refs.source is not None else None
    )
    names = {MODEL_FILE: MAX_ARTIFACT_BYTES, CONFIG_FILE: CONFIG_MAX_BYTES}
    if spec.outputs.checkpoint:
        names[CHECKPOINT_FILE] = MAX_ARTIFACT_BYTES
    outputs = {
        name: {"url": put_url(settings, job_id=job_id, name=name, max_bytes=size, now=now), "max_bytes": size}
        for name, size in names.items()
    }
    return JobStage(
        code=code,
        requirements_digest=spec.code.requirements_digest if spec.code else None,
        data_by_region=by_region,
        data_default=default,
        outputs=outputs,
        sandbox=spec.code is not None,
    )


def _url(ref: ResolvedRef, *, job_id: str, settings: Settings, now: float, presign: Presign | None) -> str:
    uri: DataUri = ref.uri
    match uri.scheme:
        case "artifact":
            size = ref.bytes if ref.bytes else MAX_ARTIFACT_BYTES
            return get_url(settings, job_id=job_id, digest=uri.digest or "", max_bytes=size, now=now)
        case "s3":
            if presign is None:
                raise FailedPrecondition(
                    f"{ref.field}: no S3 store is configured to presign {uri.text[:200]}", field=ref.field
                )
            return presign(uri.bucket or "", uri.key or "")
        case _:  # https and file:// go to the agent as they are
            return uri.text
