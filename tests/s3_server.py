"""moto's S3 in server mode on a free loopback port, for the artifact store's tests."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import boto3

from tests.processes import free_port

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Endpoint:
    url: str
    bucket: str

    def client(self):  # noqa: ANN201 - boto3's client type
        return boto3.client("s3", endpoint_url=self.url, region_name=REGION, **CREDENTIALS)

    def settings(self) -> dict[str, object]:
        """Settings fields that point a control plane's store at this bucket."""
        return {
            "artifact_store": "s3",
            "s3_endpoint_url": self.url,
            "s3_bucket": self.bucket,
            "s3_region": REGION,
            "s3_access_key_id": CREDENTIALS["aws_access_key_id"],
            "s3_secret_access_key": CREDENTIALS["aws_secret_access_key"],
        }


@contextmanager
def moto_s3() -> Iterator[S3Endpoint]:
    """A running moto server with one fresh bucket; stopped on exit."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = S3Endpoint(f"http://127.0.0.1:{port}", f"cpn-test-{secrets.token_hex(4)}")
        endpoint.client().create_bucket(Bucket=endpoint.bucket)
        yield endpoint
    finally:
        server.stop()
