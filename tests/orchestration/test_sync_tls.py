"""Per-job sync credentials: any issuance of a job's CA trusts the job's leaders (a re-placed region
rejoins the survivors), another job's leaders are refused at the handshake."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from contracts.sync_config import SyncConfig
from orchestration.sync_tls import leader_credentials
from tests.training.test_sync_transport import Region
from training.compression import encode_tensor, get_codec
from training.sync.messages import Meta, OutMessage
from training.sync.stats import TransferStats
from training.sync.tls import SyncTls
from training.sync.transport import PeerClient, PeerError, SyncServer
from training.wan.shaper import LinkShaper

SECRET = "ab" * 32


def _tls(job_id: str, participant: str, secret: str = SECRET) -> SyncTls:
    c = leader_credentials(secret, job_id, participant)
    return SyncTls(c["tls_ca_pem"].encode(), c["tls_cert_pem"].encode(), c["tls_key_pem"].encode())


def test_a_jobs_leaders_trust_each_other_across_issuances_and_no_other_job() -> None:
    region = Region()
    server = SyncServer(region, LinkShaper(), TransferStats(), auth_secret=SECRET, tls=_tls("job-1", "b"))  # type: ignore[arg-type]
    server.start()
    try:
        x = encode_tensor(torch.ones(4), get_codec("fp32"))
        callers = [
            (_tls("job-1", "a"), True),  # issued later (a re-placed attempt): same CA name and key
            (_tls("job-2", "a"), False),  # another job's CA
            (_tls("job-1", "a", secret="cd" * 32), False),  # the same job id under another secret
        ]
        for tls, admitted in callers:
            client = PeerClient(
                "a", "b", server.address, LinkShaper(), TransferStats(), auth_secret=SECRET, tls=tls
            )
            try:
                if admitted:
                    client.push(OutMessage(Meta("a", "t", round=1), [("x", x)]), timeout=10)
                else:
                    with pytest.raises(PeerError) as e:
                        client.push(OutMessage(Meta("a", "t", round=1), [("x", x)]), timeout=10)
                    assert e.value.status == "UNAVAILABLE"
            finally:
                client.close()
        assert len(region.got) == 1
    finally:
        server.stop()


def test_tls_material_comes_whole() -> None:
    creds = leader_credentials(SECRET, "job-1", "a")
    SyncConfig(mode="diloco", every=2, **creds)
    with pytest.raises(ValidationError, match="go together"):
        SyncConfig(mode="diloco", every=2, tls_ca_pem=creds["tls_ca_pem"])
    with pytest.raises(ValidationError):
        SyncConfig(mode="diloco", every=2, **{**creds, "tls_key_pem": "x" * 20_000})  # bounded
