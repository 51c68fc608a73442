"""The sync service over mutual TLS: a job's leaders, holding certificates of the job's CA, reach
each other; a plaintext caller or one holding another CA's certificate never reaches the handler."""

from __future__ import annotations

import pytest
import torch

from tests.certs import Ca
from tests.training.test_sync_transport import Region
from training.compression import encode_tensor, get_codec
from training.sync.messages import Meta, OutMessage
from training.sync.stats import TransferStats
from training.sync.tls import SERVER_NAME, SyncTls
from training.sync.transport import PeerClient, PeerError, SyncServer
from training.wan.shaper import LinkShaper

SECRET = "ab" * 32


def _tls(ca: Ca, name: str) -> SyncTls:
    leaf = ca.issue(name, hosts=(SERVER_NAME,))
    return SyncTls(ca_pem=ca.pair.cert_pem, cert_pem=leaf.cert_pem, key_pem=leaf.key_pem)


def _push(client: PeerClient) -> None:
    x = encode_tensor(torch.ones(4), get_codec("fp32"))
    client.push(OutMessage(Meta("a", "t", round=1), [("x", x)]), timeout=10)


def test_leaders_of_one_job_sync_over_mutual_tls_and_nobody_else_connects() -> None:
    job_ca = Ca("job CA")
    region = Region()
    server = SyncServer(
        region,
        LinkShaper(),
        TransferStats(),
        auth_secret=SECRET,
        tls=_tls(job_ca, "leader-b"),  # type: ignore[arg-type]
    )
    server.start()
    clients: list[PeerClient] = []
    try:

        def client(tls: SyncTls | None) -> PeerClient:
            c = PeerClient(
                "a", "b", server.address, LinkShaper(), TransferStats(), auth_secret=SECRET, tls=tls
            )
            clients.append(c)
            return c

        _push(client(_tls(job_ca, "leader-a")))
        assert len(region.got) == 1
        other_ca = Ca("another job's CA")
        outsiders = [
            client(None),  # plaintext
            client(_tls(other_ca, "leader-a")),  # a certificate the job's CA did not sign
            # trusts the job's CA but presents another CA's certificate: the server refuses it
            client(SyncTls(job_ca.pair.cert_pem, *_pair(other_ca))),
        ]
        for outsider in outsiders:
            with pytest.raises(PeerError) as e:
                _push(outsider)
            assert e.value.status == "UNAVAILABLE"
        assert len(region.got) == 1
    finally:
        for c in clients:
            c.close()
        server.stop()


def _pair(ca: Ca) -> tuple[bytes, bytes]:
    leaf = ca.issue("leader-a", hosts=(SERVER_NAME,))
    return leaf.cert_pem, leaf.key_pem
