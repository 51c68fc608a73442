"""The S3 store: blobs as objects ``<prefix>sha256/ab/<hex>`` in one bucket of any S3-compatible
service. A write streams into a multipart upload under ``<prefix>tmp/`` (a buffer of one part in
memory), then is copied under its digest; a blob smaller than one part goes there in one PUT."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from contracts.artifacts import DIGEST_RE, MAX_ARTIFACT_BYTES
from contracts.errors import NotFound
from orchestration.artifacts.store import CHUNK_BYTES, PRESIGN_TTL_S, BlobInfo, Digesting, Stored, blob_key
from orchestration.settings import Settings

PART_BYTES = 8 * 1024 * 1024  # S3 wants parts of at least 5 MiB (but the last)


def _missing(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


class _MultipartWriter:
    def __init__(self, store: S3Store, max_bytes: int) -> None:
        self._store = store
        self._digesting = Digesting(max_bytes)
        self._buffer = bytearray()
        self._tmp_key = f"{store.prefix}tmp/{uuid.uuid4().hex}"
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []

    @property
    def bytes(self) -> int:
        return self._digesting.bytes

    def write(self, data: bytes) -> None:
        self._digesting.take(data)
        self._buffer += data
        if len(self._buffer) >= self._store.part_bytes:
            self._flush()

    def _flush(self) -> None:
        s3 = self._store.client
        if self._upload_id is None:
            made = s3.create_multipart_upload(Bucket=self._store.bucket, Key=self._tmp_key)
            self._upload_id = made["UploadId"]
        number = len(self._parts) + 1
        answer = s3.upload_part(
            Bucket=self._store.bucket,
            Key=self._tmp_key,
            UploadId=self._upload_id,
            PartNumber=number,
            Body=bytes(self._buffer),
        )
        self._parts.append({"PartNumber": number, "ETag": answer["ETag"]})
        self._buffer.clear()

    def commit(self, expected_digest: str | None = None) -> Stored:
        digest = self._digesting.check(expected_digest)
        store, final = self._store, self._store.key(digest)
        if store.size(digest) is not None:
            self.abort()
            return Stored(digest, self.bytes, created=False)
        if self._upload_id is None:  # under one part: straight to its place
            store.client.put_object(Bucket=store.bucket, Key=final, Body=bytes(self._buffer))
            self._buffer.clear()
            return Stored(digest, self.bytes, created=True)
        if self._buffer:
            self._flush()
        store.client.complete_multipart_upload(
            Bucket=store.bucket,
            Key=self._tmp_key,
            UploadId=self._upload_id,
            MultipartUpload={"Parts": self._parts},
        )
        self._upload_id = None
        try:
            # The managed copy: one CopyObject, or a multipart copy past 5 GiB.
            store.client.copy({"Bucket": store.bucket, "Key": self._tmp_key}, store.bucket, final)
        finally:
            store.client.delete_object(Bucket=store.bucket, Key=self._tmp_key)
        return Stored(digest, self.bytes, created=True)

    def abort(self) -> None:
        self._buffer.clear()
        if self._upload_id is not None:
            with contextlib.suppress(ClientError):
                self._store.client.abort_multipart_upload(
                    Bucket=self._store.bucket, Key=self._tmp_key, UploadId=self._upload_id
                )
            self._upload_id = None


class S3Store:
    kind = "s3"

    def __init__(
        self,
        client: Any,
        bucket: str,
        prefix: str = "",
        *,
        chunk_bytes: int = CHUNK_BYTES,
        part_bytes: int = PART_BYTES,
    ) -> None:
        self.client, self.bucket, self.prefix = client, bucket, prefix
        self.chunk_bytes, self.part_bytes = chunk_bytes, part_bytes

    @classmethod
    def from_settings(cls, settings: Settings) -> S3Store:
        assert settings.s3_bucket
        path_style = {"addressing_style": "path"} if settings.s3_endpoint_url else {}
        client = boto3.client(
            "s3",
            endpoint_url=settings.s3_endpoint_url,
            region_name=settings.s3_region,
            aws_access_key_id=settings.s3_access_key_id,
            aws_secret_access_key=settings.s3_secret_access_key,
            config=Config(signature_version="s3v4", s3=path_style, retries={"mode": "standard"}),
        )
        return cls(client, settings.s3_bucket, settings.s3_prefix)

    def key(self, digest: str) -> str:
        return self.prefix + blob_key(digest)

    def begin(self, max_bytes: int = MAX_ARTIFACT_BYTES) -> _MultipartWriter:
        return _MultipartWriter(self, max_bytes)

    def size(self, digest: str) -> int | None:
        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=self.key(digest))["ContentLength"])
        except ClientError as exc:
            if _missing(exc):
                return None
            raise

    def open(self, digest: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        extra = {} if start == 0 and end is None else {"Range": f"bytes={start}-{'' if end is None else end}"}
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(digest), **extra)["Body"]
        except ClientError as exc:
            if _missing(exc):
                raise NotFound(f"no blob {digest}", digest=digest) from None
            raise
        return self._read(body)

    def _read(self, body: Any) -> Iterator[bytes]:
        try:
            yield from body.iter_chunks(self.chunk_bytes)
        finally:
            body.close()

    def delete(self, digest: str) -> bool:
        if self.size(digest) is None:
            return False
        self.client.delete_object(Bucket=self.bucket, Key=self.key(digest))
        return True

    def blobs(self) -> Iterator[BlobInfo]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}sha256/"
        )
        for page in pages:
            for item in page.get("Contents", []):
                digest = "sha256:" + item["Key"].rsplit("/", 1)[-1]
                if DIGEST_RE.match(digest):
                    yield BlobInfo(digest, int(item["Size"]), item["LastModified"])

    def stale_uploads(self, older_than: Any) -> int:
        """Abort multipart uploads that never finished (a crashed server's); how many."""
        answer = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=f"{self.prefix}tmp/")
        removed = 0
        for upload in answer.get("Uploads", []):
            if upload["Initiated"] < older_than:
                with contextlib.suppress(ClientError):
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                    removed += 1
        return removed

    def presign_get(self, digest: str, ttl_s: int = PRESIGN_TTL_S) -> str | None:
        return self.presign_external(self.bucket, self.key(digest), ttl_s)

    def tenant_prefix(self, tenant_id: str) -> str:
        """Where a tenant's own objects live in ``bucket``: what it may name as ``outputs.uri``."""
        return f"{self.prefix}tenants/{tenant_id}/"

    def object_size(self, bucket: str, key: str) -> int | None:
        """Bytes of an object the store's credentials can read; None when absent or not allowed."""
        try:
            return int(self.client.head_object(Bucket=bucket, Key=key)["ContentLength"])
        except ClientError:
            return None

    def presign_external(self, bucket: str, key: str, ttl_s: int = PRESIGN_TTL_S) -> str | None:
        return str(
            self.client.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=int(ttl_s)
            )
        )
