"""The artifact store over REST: tenants upload, list, download (with ``Range``) and delete their
blobs; agents read a task's inputs and write a job's outputs with signed tickets instead of keys.

Uploads stream: the body is hashed and written as it arrives (the server's body limit exempts
these routes, which bound it themselves: the tenant's quota, the ticket's ``max_bytes``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from contracts.artifacts import (
    DIGEST_RE,
    MAX_ARTIFACT_BYTES,
    ArtifactKind,
    ArtifactTicket,
    TicketAction,
    check_digest,
    check_output_name,
    verify_ticket,
)
from contracts.errors import (
    Aborted,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    QuotaExceeded,
)
from control_layer import jobs as job_service
from orchestration.artifacts import policy, records
from orchestration.artifacts.store import ArtifactStore, BlobWriter, Stored
from orchestration.artifacts.urls import artifact_key
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import session_scope
from orchestration.db.models import Artifact, Job
from service_layer.byte_ranges import Unsatisfiable, parse_range
from service_layer.deps import CtxDep, CurrentTenant, SessionDep
from service_layer.schemas.artifacts import ArtifactRead
from service_layer.schemas.common import error_responses

router = APIRouter(tags=["artifacts"])

UPLOAD_PATH = "/artifacts"
OUTPUT_PATH_PARTS = ("jobs", "outputs")  # PUT /v1/jobs/{job_id}/outputs/{name}

NameQuery = Annotated[
    str, Query(max_length=255, pattern=r"^[^\x00-\x1f/\\]*$", description="A label, e.g. the file's name")
]
DigestQuery = Annotated[
    str | None,
    Query(pattern=DIGEST_RE.pattern, description="sha256:<hex> the body must match (422 if not)"),
]
TicketQuery = Annotated[str, Query(min_length=1, max_length=1024, description="The signed ticket")]
_BINARY_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def streamed_upload(method: str, path: str) -> bool:
    """The routes that stream their bodies (for ``BodyLimit``'s exemption)."""
    if method == "POST" and path.rstrip("/") == "/v1" + UPLOAD_PATH:
        return True
    parts = path.strip("/").split("/")
    return (
        method == "PUT" and len(parts) == 5 and parts[0] == "v1" and (parts[1], parts[3]) == OUTPUT_PATH_PARTS
    )


def _read(row: Artifact) -> ArtifactRead:
    return ArtifactRead(
        id=row.id,
        digest=row.digest,
        uri=f"artifact:{row.digest}",
        bytes=row.bytes,
        kind=row.kind,
        name=row.name,
        job_id=row.job_id,
        created_at=row.created_at,
        expires_at=row.expires_at,
    )


def _json(row: Artifact, created: bool) -> Response:
    return Response(
        _read(row).model_dump_json(), status_code=201 if created else 200, media_type="application/json"
    )


def _declared(content_length: str | None) -> int | None:
    try:
        return int(content_length) if content_length is not None else None
    except ValueError:
        raise InvalidArgument("Content-Length is not a number", field="Content-Length") from None


async def _stream_into(
    request: Request, writer: BlobWriter, chunk_bytes: int, expected: str | None
) -> Stored:
    """The request's body, written through ``writer`` in chunks off the event loop, then committed."""
    pending = bytearray()
    try:
        async for piece in request.stream():
            pending += piece
            if len(pending) >= chunk_bytes:
                await run_in_threadpool(writer.write, bytes(pending))
                pending.clear()
    except ClientDisconnect:
        raise InvalidArgument("the upload ended before its body did", field="body") from None
    if pending:
        await run_in_threadpool(writer.write, bytes(pending))
    return await run_in_threadpool(writer.commit, expected)


def _forget_if_unnamed(ctx: ServerContext, stored: Stored) -> None:
    """Undo a fresh blob no row came to name (the upload was refused after it was written)."""
    if stored.created:
        with ctx.session_factory() as session:
            if not records.named(session, stored.digest):
                ctx.artifacts.delete(stored.digest)


def _still_there(store: ArtifactStore, digest: str) -> None:
    # A DELETE racing this upload may have taken the blob between its write and the new row.
    if store.size(digest) is None:
        raise Aborted("the artifact was deleted while it was uploaded; upload it again", digest=digest)


def _usage(ctx: ServerContext, tenant_id: str) -> tuple[int, int]:
    with ctx.session_factory() as session:
        return records.usage(session, tenant_id), records.quota(
            session, tenant_id, ctx.settings.artifact_quota_bytes
        )


def _renew(ctx: ServerContext, tenant_id: str, digest: str) -> Artifact | None:
    with session_scope(ctx.session_factory) as session:
        row = records.find_upload(session, tenant_id, digest)
        if row is None or ctx.artifacts.size(digest) is None:
            return None
        row.expires_at = policy.expiry(utcnow(), ctx.settings.artifact_retention_days)
        session.flush()
        session.expunge(row)
        return row


@router.post(
    UPLOAD_PATH,
    status_code=201,
    response_model=ArtifactRead,
    summary="Upload an artifact (streamed body)",
    responses={
        200: {"description": "The tenant already had these bytes"},
        **error_responses(401, 409, 413, 422),
    },
    openapi_extra=_BINARY_BODY,
)
async def upload_artifact(
    request: Request,
    tenant: CurrentTenant,
    name: NameQuery = "",
    kind: Annotated[ArtifactKind, Query(description="code | data | model | checkpoint | other")] = "other",
    digest: DigestQuery = None,
    content_length: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    """Store the body (any bytes; `Content-Length` lets an upload over the quota be refused before
    it is sent). The answer's `uri` (`artifact:sha256:...`) goes into a job spec. Uploading bytes
    the tenant already keeps returns that artifact (200) and renews its expiry; with `digest` given
    and known, the body is not even read. A body whose SHA-256 is not `digest` → 422; over the
    tenant's quota → 413 `quota_exceeded` naming the numbers; nothing is stored either way."""
    ctx: ServerContext = request.app.state.ctx
    if digest is not None and (known := await run_in_threadpool(_renew, ctx, tenant.id, digest)):
        return _json(known, created=False)
    declared = _declared(content_length)
    used, quota = await run_in_threadpool(_usage, ctx, tenant.id)
    limit = policy.upload_limit(used, quota)
    if declared is not None:
        if declared > MAX_ARTIFACT_BYTES:
            raise PayloadTooLarge(
                f"an artifact is at most {MAX_ARTIFACT_BYTES} bytes; this one is {declared}",
                limit_bytes=MAX_ARTIFACT_BYTES,
            )
        policy.check_quota(used, quota, declared)
    writer = await run_in_threadpool(ctx.artifacts.begin, limit)
    try:
        stored = await _stream_into(request, writer, ctx.artifacts.chunk_bytes, digest)
    except PayloadTooLarge:
        if limit < MAX_ARTIFACT_BYTES:
            policy.check_quota(used, quota, limit + 1)  # raises, naming the quota
        raise
    finally:
        await run_in_threadpool(writer.abort)
    row, created = await run_in_threadpool(_record_upload, ctx, tenant.id, stored, kind, name, quota)
    return _json(row, created)


def _record_upload(
    ctx: ServerContext, tenant_id: str, stored: Stored, kind: ArtifactKind, name: str, quota: int
) -> tuple[Artifact, bool]:
    try:
        with session_scope(ctx.session_factory) as session:
            row, created = records.record_upload(
                session,
                tenant_id=tenant_id,
                stored=stored,
                kind=kind,
                name=name,
                now=utcnow(),
                retention_days=ctx.settings.artifact_retention_days,
                quota_bytes=quota,
            )
            session.flush()
            session.expunge(row)
    except QuotaExceeded:
        _forget_if_unnamed(ctx, stored)
        raise
    _still_there(ctx.artifacts, stored.digest)
    return row, created


@router.get(
    "/artifacts",
    response_model=list[ArtifactRead],
    summary="List artifacts",
    responses=error_responses(401, 422),
)
def list_artifacts(
    session: SessionDep,
    tenant: CurrentTenant,
    kind: Annotated[ArtifactKind | None, Query(description="Only this kind")] = None,
    digest: DigestQuery = None,
    limit: Annotated[int, Query(ge=1, le=records.MAX_LIST)] = 100,
) -> list[ArtifactRead]:
    """The tenant's artifacts, newest first (an admin key: every tenant's); `digest`: only those
    of these bytes (a client checks before it uploads)."""
    rows = records.list_rows(
        session, tenant_id=None if tenant.is_admin else tenant.id, kind=kind, digest=digest, limit=limit
    )
    return [_read(r) for r in rows]


@router.get(
    "/jobs/{job_id}/artifacts",
    response_model=list[ArtifactRead],
    summary="A job's outputs",
    responses=error_responses(401, 404),
)
def job_artifacts(session: SessionDep, tenant: CurrentTenant, job_id: str) -> list[ArtifactRead]:
    """What the job's tasks uploaded (its final model, its config, a checkpoint if asked for), by
    name; download each with `GET /v1/artifacts/{id}` (or `cpn jobs download`)."""
    job = job_service.get_job(session, tenant, job_id)
    return [_read(r) for r in records.list_rows(session, tenant_id=None, job_id=job.id)]


def _blob_response(
    store: ArtifactStore, digest: str, range_header: str | None, filename: str = ""
) -> Response:
    size = store.size(digest)
    if size is None:
        raise NotFound(f"the bytes of {digest} are not in the store", digest=digest)
    headers = {"Accept-Ranges": "bytes", "ETag": f'"{digest.removeprefix("sha256:")}"'}
    if filename:
        headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    try:
        wanted = parse_range(range_header, size)
    except Unsatisfiable:
        return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{size}"})
    if wanted is None:
        body: Iterator[bytes] = store.open(digest) if size else iter(())
        headers["Content-Length"] = str(size)
        return StreamingResponse(
            body, status_code=200, headers=headers, media_type="application/octet-stream"
        )
    headers["Content-Range"] = wanted.content_range(size)
    headers["Content-Length"] = str(wanted.length)
    body = store.open(digest, wanted.start, wanted.end)
    return StreamingResponse(body, status_code=206, headers=headers, media_type="application/octet-stream")


def _safe_filename(name: str) -> str:
    return "".join(c for c in name if c.isalnum() or c in "._-")[:128]


@router.get(
    "/artifacts/{artifact_id}",
    summary="Download an artifact (Range supported)",
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The bytes"},
        206: {"description": "The requested range (Content-Range)"},
        416: {"description": "The range starts past the end"},
        **error_responses(401, 404),
    },
)
def download_artifact(
    ctx: CtxDep,
    tenant: CurrentTenant,
    artifact_id: str,
    range_header: Annotated[str | None, Header(alias="Range", include_in_schema=False)] = None,
) -> Response:
    """The bytes, streamed; `Range: bytes=N-` resumes a partial download (206)."""
    with ctx.session_factory() as session:
        row = records.get_row(session, None if tenant.is_admin else tenant.id, artifact_id)
        digest, name = row.digest, row.name
    return _blob_response(ctx.artifacts, digest, range_header, _safe_filename(name))


@router.delete(
    "/artifacts/{artifact_id}",
    response_model=ArtifactRead,
    summary="Delete an artifact",
    responses=error_responses(401, 404),
)
def delete_artifact(ctx: CtxDep, tenant: CurrentTenant, artifact_id: str) -> ArtifactRead:
    """Forget the artifact (its bytes go once no other artifact names them); frees its quota."""
    row = records.delete_row(
        ctx.session_factory, ctx.artifacts, None if tenant.is_admin else tenant.id, artifact_id
    )
    return _read(row)


# -- agents: tickets instead of keys (orchestration/artifacts/urls.py signs them)


def _ticket(
    ctx: ServerContext, text: str, *, action: TicketAction, job_id: str | None, target: str
) -> ArtifactTicket:
    """The ticket, if it is genuine and unexpired (else 401) and allows exactly this (else 403)."""
    ticket = ArtifactTicket.decode(text)
    verify_ticket(
        artifact_key(ctx.settings), ticket, action=ticket.action, target=ticket.target, now=time.time()
    )
    if ticket.action != action or ticket.target != target or (job_id is not None and ticket.job_id != job_id):
        raise PermissionDenied(
            f"this ticket allows {ticket.action} of {ticket.target[:80]!r} for job {ticket.job_id[:32]}, "
            f"not {action} of {target[:80]!r}",
            field="ticket",
        )
    return ticket


@router.get(
    "/artifacts/content/{digest}",
    summary="A blob by digest, with a ticket (agents)",
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The bytes"},
        206: {"description": "The requested range"},
        307: {"description": "Fetch it from the store's presigned URL instead (S3)"},
        **error_responses(401, 403, 404),
    },
)
def blob_by_ticket(
    ctx: CtxDep,
    digest: str,
    ticket: TicketQuery,
    range_header: Annotated[str | None, Header(alias="Range", include_in_schema=False)] = None,
) -> Response:
    """What a task stages: a `get` ticket for this digest, no API key. With the S3 store, a
    redirect to a presigned URL (Range goes along)."""
    allowed = _ticket(ctx, ticket, action="get", job_id=None, target=digest)
    store = ctx.artifacts
    if store.kind == "s3":
        if store.size(digest) is None:
            raise NotFound(f"the bytes of {digest} are not in the store", digest=digest)
        ttl = max(1, min(3600, int(allowed.expires_at - time.time())))
        url = store.presign_get(digest, ttl)
        if url:
            return RedirectResponse(url, status_code=307)
    return _blob_response(store, digest, range_header)


def _job_tenant(ctx: ServerContext, job_id: str) -> str:
    with ctx.session_factory() as session:
        tenant_id = session.get(Job, job_id)
        if tenant_id is None:
            raise NotFound(f"job {job_id} not found", field="job_id")
        return tenant_id.tenant_id


@router.put(
    "/jobs/{job_id}/outputs/{name}",
    status_code=201,
    response_model=ArtifactRead,
    summary="Upload one output of a job, with a ticket (agents)",
    responses={
        200: {"description": "A retry: the output was recorded before"},
        **error_responses(401, 403, 404, 413, 422),
    },
    openapi_extra=_BINARY_BODY,
)
async def put_output(
    request: Request,
    job_id: str,
    name: str,
    ticket: TicketQuery,
    content_length: Annotated[str | None, Header(include_in_schema=False)] = None,
    content_sha256: Annotated[
        str | None, Header(alias="X-Content-SHA256", include_in_schema=False, max_length=71)
    ] = None,
) -> Response:
    """The final model or a checkpoint, streamed by the agent of the task holding it. Recorded as
    an artifact of the job's tenant (kind `checkpoint` for names starting so, else `model`); a
    retry replaces what the name held. At most the ticket's `max_bytes` (413 beyond). With
    `X-Content-SHA256: sha256:<hex>` (as agents send it) a body that does not hash to it is a 422
    and nothing is recorded."""
    ctx: ServerContext = request.app.state.ctx
    check_output_name(name)
    allowed = _ticket(ctx, ticket, action="put", job_id=job_id, target=name)
    tenant_id = await run_in_threadpool(_job_tenant, ctx, job_id)
    limit = min(allowed.max_bytes, MAX_ARTIFACT_BYTES)
    declared = _declared(content_length)
    if declared is not None and declared > limit:
        raise PayloadTooLarge(
            f"this output may be at most {limit} bytes; the body is {declared}", limit_bytes=limit
        )
    writer = await run_in_threadpool(ctx.artifacts.begin, limit)
    try:
        expected = None if content_sha256 is None else check_digest(content_sha256, "X-Content-SHA256")
        stored = await _stream_into(request, writer, ctx.artifacts.chunk_bytes, expected)
    finally:
        await run_in_threadpool(writer.abort)
    row, created = await run_in_threadpool(_record_output, ctx, tenant_id, job_id, name, stored)
    return _json(row, created)


def _record_output(
    ctx: ServerContext, tenant_id: str, job_id: str, name: str, stored: Stored
) -> tuple[Artifact, bool]:
    with session_scope(ctx.session_factory) as session:
        before = session.scalar(
            select(Artifact.digest).where(Artifact.job_id == job_id, Artifact.name == name)
        )
        row, created = records.record_output(
            session,
            tenant_id=tenant_id,
            job_id=job_id,
            name=name,
            stored=stored,
            now=utcnow(),
            retention_days=ctx.settings.artifact_retention_days,
        )
        session.flush()
        session.expunge(row)
        replaced = (
            before
            if before is not None and before != stored.digest and not records.named(session, before)
            else None
        )
    if replaced:
        ctx.artifacts.delete(replaced)
    _still_there(ctx.artifacts, stored.digest)
    return row, created
