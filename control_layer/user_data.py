"""Users' code and data at quote and submission: every reference checked, every size resolved.

``resolve_refs`` checks a spec's code, data and outputs against the fleet, the tenant's uploaded
artifacts and the store, and returns what the planner prices staging from (``DataStaging``) and
what placement signs URLs for. A bad reference raises InvalidArgument naming the field (HTTP 422)
before anything is stored. The store is reached through two narrow seams (``ArtifactLookup``,
``S3Store``) so this module depends on no storage code; a control plane without them refuses the
references it cannot check rather than guessing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from contracts.artifacts import DataUri, parse_uri
from contracts.errors import InvalidArgument
from contracts.job_spec import JobSpec
from control_layer.planner.staging import DataStaging, NodeStaging, StagedBlob

HEAD_TIMEOUT_S = 5.0  # a quote waits at most this long for an https source's size


class ArtifactLookup(Protocol):
    """The artifact store's metadata: an uploaded blob's size, for its tenant only."""

    def size_of(self, tenant_id: str, digest: str) -> int | None:
        """Bytes of ``digest`` as uploaded by ``tenant_id``; None when that tenant has no such blob."""
        ...


class S3Store(Protocol):
    """The store's S3 side, where the control plane has one."""

    bucket: str

    def tenant_prefix(self, tenant_id: str) -> str:
        """The key prefix under which ``tenant_id``'s objects live in ``bucket`` (ends with '/')."""
        ...

    def object_size(self, bucket: str, key: str) -> int | None:
        """Bytes of an object the store can read; None when it cannot (absent or not allowed)."""
        ...

    def presign_external(self, bucket: str, key: str) -> str:
        """A time-limited GET URL an agent can fetch the object with."""
        ...


@dataclass
class MemoryArtifacts:
    """An ``ArtifactLookup`` over sizes held in memory (the embedded single-process server, and
    tests): ``add`` records an upload, ``size_of`` answers only its tenant."""

    sizes: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, tenant_id: str, digest: str, size: int) -> None:
        self.sizes[(tenant_id, digest)] = size

    def size_of(self, tenant_id: str, digest: str) -> int | None:
        return self.sizes.get((tenant_id, digest))


# An https source's size: (url, timeout) -> bytes (None: not stated); raises OSError-like on failure.
HeadFn = Callable[[str, float], int | None]


class Unreachable(Exception):
    """An https source did not answer a HEAD with success."""


def http_head_size(url: str, timeout_s: float) -> int | None:
    """Content-Length of ``url`` from a HEAD (redirects followed); Unreachable when it fails."""
    import httpx

    try:
        response = httpx.head(url, timeout=timeout_s, follow_redirects=True)
    except httpx.HTTPError as exc:
        raise Unreachable(f"{type(exc).__name__}: {exc}") from None
    if response.status_code >= 400:
        raise Unreachable(f"HEAD answered {response.status_code}")
    length = response.headers.get("content-length", "")
    return int(length) if length.isdigit() else None


@dataclass(frozen=True)
class ResolvedRef:
    """One checked reference: its parsed URI, its size (None: unknown) and, for s3, nothing more
    (placement presigns it when it signs the task's URLs)."""

    field: str
    uri: DataUri
    bytes: int | None


@dataclass(frozen=True)
class ResolvedRefs:
    """What a spec's references resolved to: code, the source, the shards by region."""

    code: ResolvedRef | None = None
    source: ResolvedRef | None = None
    shards: dict[str, ResolvedRef] = field(default_factory=dict)

    def staging(
        self, spec: JobSpec, store_region: str | None, nodes: NodeStagingFacts | None = None
    ) -> DataStaging:
        """The planner's input for pricing staging (``control_layer.planner.staging``); ``nodes``:
        what the nodes measured and hold (``staging_inputs.node_facts``)."""

        def blob(ref: ResolvedRef | None, digest: str | None) -> StagedBlob | None:
            if ref is None:
                return None
            size = None if ref.uri.scheme == "file" else ref.bytes
            return StagedBlob(bytes=size, digest=digest or ref.uri.digest)

        shards = spec.data.shards or {}
        facts = nodes or NodeStagingFacts()
        return DataStaging(
            code=blob(self.code, None),
            source=blob(self.source, spec.data.sha256),
            shards={
                r: b
                for r, ref in self.shards.items()
                if (b := blob(ref, shards[r].sha256 if r in shards else None)) is not None
            },
            store_region=store_region,
            requirements_digest=spec.code.requirements_digest if spec.code else None,
            nodes=facts.measured,
            cached=facts.cached,
            venvs=facts.venvs,
        )

    def digests(self, spec: JobSpec) -> tuple[list[str], list[str]]:
        """(blob digests, requirements digests) the job stages: what a node's cache may hold."""
        shards = spec.data.shards or {}
        blobs = [spec.code.digest] if spec.code else []
        if self.source is not None:
            blobs.append(spec.data.sha256 or self.source.uri.digest or "")
        for region, ref in self.shards.items():
            blobs.append((shards[region].sha256 if region in shards else None) or ref.uri.digest or "")
        reqs = [spec.code.requirements_digest] if spec.code and spec.code.requirements_digest else []
        return sorted({b for b in blobs if b}), reqs


@dataclass(frozen=True)
class NodeStagingFacts:
    """Per node id: what its agent measured of staging, and which of a job's blobs and venvs its
    cache holds (``control_layer.staging_inputs``)."""

    measured: dict[str, NodeStaging] = field(default_factory=dict)
    cached: dict[str, list[str]] = field(default_factory=dict)
    venvs: dict[str, list[str]] = field(default_factory=dict)


def needs_resolution(spec: JobSpec) -> bool:
    """Whether the spec references anything to check (code, a data source or shards, outputs)."""
    return bool(spec.code or spec.data.source or spec.data.shards or spec.outputs.uri)


def resolve_refs(
    spec: JobSpec,
    tenant_id: str,
    *,
    regions: Iterable[str],
    artifacts: ArtifactLookup | None,
    s3: S3Store | None,
    output_allow: Iterable[str] = (),
    head: HeadFn = http_head_size,
    head_timeout_s: float = HEAD_TIMEOUT_S,
) -> ResolvedRefs:
    """Check every reference of ``spec`` for ``tenant_id``; InvalidArgument names the first bad
    field. ``regions``: the fleet's; ``output_allow``: s3 prefixes ("s3://bucket/prefix") any
    tenant may write besides its own prefix of the store's bucket."""
    known = set(regions)
    shards = spec.data.shards or {}
    for region in sorted(shards):
        if region not in known:
            raise InvalidArgument(
                f"data.shards.{region}: the fleet has no region {region!r} (it has {sorted(known)[:50]})",
                field=f"data.shards.{region}",
            )
    if spec.outputs.uri is not None:
        _check_output(spec.outputs.uri, tenant_id, s3, output_allow)

    def resolve(uri: str, name: str) -> ResolvedRef:
        parsed = parse_uri(uri, name)
        return ResolvedRef(name, parsed, _size(parsed, name, tenant_id, artifacts, s3, head, head_timeout_s))

    code = None
    if spec.code is not None:
        code = resolve(f"artifact:{spec.code.digest}", "code.digest")
    source = resolve(spec.data.source, "data.source") if spec.data.source else None
    resolved = {r: resolve(s.uri, f"data.shards.{r}.uri") for r, s in sorted(shards.items())}
    return ResolvedRefs(code=code, source=source, shards=resolved)


def _size(
    uri: DataUri,
    name: str,
    tenant_id: str,
    artifacts: ArtifactLookup | None,
    s3: S3Store | None,
    head: HeadFn,
    timeout_s: float,
) -> int | None:
    match uri.scheme:
        case "artifact":
            if artifacts is None:
                raise InvalidArgument(f"{name}: this control plane has no artifact store", field=name)
            size = artifacts.size_of(tenant_id, uri.digest or "")
            if size is None:
                raise InvalidArgument(
                    f"{name}: {uri.digest} was not uploaded by this tenant (upload it first:"
                    " POST /v1/artifacts or cpn jobs submit --code)",
                    field=name,
                )
            return size
        case "s3":
            if s3 is None:
                raise InvalidArgument(
                    f"{name}: this control plane has no S3 store configured to read {uri.text[:200]}",
                    field=name,
                )
            size = s3.object_size(uri.bucket or "", uri.key or "")
            if size is None:
                raise InvalidArgument(f"{name}: the store cannot read {uri.text[:200]}", field=name)
            return size
        case "https" | "http":
            try:
                size = head(uri.url or "", timeout_s)
            except Unreachable as exc:
                raise InvalidArgument(
                    f"{name}: {uri.url[:200] if uri.url else ''} is unreachable: {exc}", field=name
                ) from None
            if size is not None and (not math.isfinite(size) or size < 0):
                return None
            return size
        case _:  # file://: already on the provider's node, nothing fetched, size unknown
            return None


def _check_output(uri: str, tenant_id: str, s3: S3Store | None, allow: Iterable[str]) -> None:
    parsed = parse_uri(uri, "outputs.uri")
    target = f"{parsed.bucket}/{parsed.key or ''}"
    for prefix in allow:
        allowed = parse_uri(prefix, "outputs allow-list")
        if allowed.scheme == "s3" and _under(target, f"{allowed.bucket}/{allowed.key or ''}"):
            return
    if (
        s3 is not None
        and parsed.bucket == s3.bucket
        and _under(parsed.key or "", s3.tenant_prefix(tenant_id))
    ):
        return
    where = (
        f"s3://{s3.bucket}/{s3.tenant_prefix(tenant_id)}"
        if s3 is not None
        else "none (no S3 store configured)"
    )
    raise InvalidArgument(
        f"outputs.uri: this tenant may not write {uri[:200]}; allowed: {where} or the operator's allow-list",
        field="outputs.uri",
    )


def _under(path: str, prefix: str) -> bool:
    """``path`` lies under ``prefix`` taken as a directory ('a/b' is under 'a/', not under 'a/bc')."""
    if not prefix or prefix.endswith("/"):
        return path.startswith(prefix)
    return path == prefix or path.startswith(prefix + "/")
