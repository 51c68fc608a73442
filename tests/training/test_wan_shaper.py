"""The transport's link shaper: rate and latency as measured through real gRPC on loopback."""

from __future__ import annotations

import time

import pytest
import torch

from contracts.errors import InvalidArgument
from contracts.links import LinkSpec, parse_links
from training.compression import encode_tensor, get_codec
from training.sync.messages import Meta, OutMessage, PushResult
from training.sync.stats import TransferStats
from training.sync.transport import PeerClient, SyncServer
from training.wan.shaper import LinkShaper


class Sink:
    region = "b"

    def __init__(self) -> None:
        self.got: list = []

    def known(self, region: str) -> bool:
        return region == "a"

    def handle_push(self, msg):  # noqa: ANN001, ANN201
        self.got.append(msg)
        return PushResult(True)


def _push(mbps: float, ms: float, nbytes: int) -> tuple[float, TransferStats, Sink]:
    links = {"a|b": LinkSpec(bandwidth_mbps=mbps, latency_ms=ms)}
    sink, stats = Sink(), TransferStats()
    server = SyncServer(sink, LinkShaper(links), stats)  # type: ignore[arg-type]
    server.start()
    client = PeerClient("a", "b", server.address, LinkShaper(links), TransferStats())
    try:
        enc = encode_tensor(torch.randn(nbytes // 4), get_codec("fp32"), chunk_bytes=256 << 10)
        t0 = time.monotonic()
        client.push(OutMessage(Meta("a", "probe"), [("x", enc)]), timeout=30)
        return time.monotonic() - t0, stats, sink
    finally:
        client.close()
        server.stop()


def test_measured_rate_never_exceeds_the_setting() -> None:
    _, stats, sink = _push(mbps=16, ms=0, nbytes=2 << 20)  # ~1 s at 2 MB/s
    ((n, seconds, rate),) = stats.take()["transfers"]
    assert rate == pytest.approx(2e6)
    assert n >= 2 << 20 and sink.got[0].tensors["x"].numel() == (2 << 20) // 4
    # Never faster than set (a busy host may make it slower: that is not the shaper's doing).
    assert (n / seconds) / rate <= 1.1


def test_latency_is_paid_each_way() -> None:
    elapsed, _, _ = _push(mbps=1000, ms=100, nbytes=4096)
    assert elapsed >= 0.2  # one way out, the ack back


def test_link_keys_are_validated() -> None:
    assert list(parse_links({"b|a": LinkSpec()})) == ["a|b"]
    for bad in ("a", "a|a", "a|b|c", "|b"):
        with pytest.raises(InvalidArgument):
            parse_links({bad: LinkSpec()})
    with pytest.raises(InvalidArgument):
        parse_links({"a|b": LinkSpec(), "b|a": LinkSpec()})
    with pytest.raises(InvalidArgument, match="outside"):
        parse_links({"a|z": LinkSpec()}, {"a", "b"})
