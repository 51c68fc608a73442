"""Per-chunk codecs and error feedback."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from contracts.errors import InvalidArgument
from training.compression import ErrorFeedback, decode_tensor, encode_tensor, get_codec
from training.compression.codecs import EncodedChunk, decode_chunk_into


def test_lossless_and_half_precision_round_trips() -> None:
    x = torch.randn(10_000)
    assert torch.equal(decode_tensor(encode_tensor(x, get_codec("none")), get_codec("fp32")), x)
    for name, tol in (("fp16", 1e-3), ("bf16", 1e-2)):
        y = decode_tensor(encode_tensor(x, get_codec(name)), get_codec(name))
        assert torch.allclose(y, x, rtol=tol, atol=1e-4), name


def test_fp16_saturates_instead_of_overflowing() -> None:
    y = decode_tensor(encode_tensor(torch.tensor([1e6, -1e6]), get_codec("fp16")), get_codec("fp16"))
    assert torch.isfinite(y).all() and y[0] == 65504.0


def test_int8_error_is_within_half_a_step_of_each_blocks_scale() -> None:
    codec = get_codec("int8", int8_block=64)
    x = torch.randn(1000) * torch.linspace(0.01, 10, 1000)
    enc = encode_tensor(x, codec, chunk_bytes=256)  # several chunks, several blocks each
    assert len(enc.chunks) == 4 and enc.nbytes < x.numel() * 1.1
    y = decode_tensor(enc, codec)
    for lo in range(0, 1000, 64):
        blk = slice(lo, min(lo + 64, 1000)) if lo < 768 else None
        if blk is None:
            continue
        step = x[blk].abs().max() / 127
        assert (y[blk] - x[blk]).abs().max() <= step / 2 + 1e-6


def test_int8_values_are_huffman_coded_losslessly() -> None:
    # Absmax-scaled Gaussian values crowd near zero: coded, a chunk is ~0.9 of a byte a value,
    # and it decodes to exactly the quantised values (computed here apart from the codec).
    codec = get_codec("int8", int8_block=256)
    x = torch.randn(40_960, generator=torch.Generator().manual_seed(0))
    enc = encode_tensor(x, codec, chunk_bytes=10_240)
    assert len(enc.chunks) == 4
    assert all(len(c.data) < 0.95 * c.numel for c in enc.chunks)
    blocks = x.numpy().reshape(-1, 256)
    scale = np.abs(blocks).max(axis=1, keepdims=True).astype(np.float32) / np.float32(127.0)
    want = (np.clip(np.round(blocks / scale), -127, 127) * scale).reshape(-1)
    assert np.array_equal(decode_tensor(enc, codec).numpy(), want)


def test_int8_chunk_the_coding_cannot_shrink_travels_raw() -> None:
    codec = get_codec("int8", int8_block=4096)
    x = torch.rand(4096, generator=torch.Generator().manual_seed(1)) * 2 - 1  # uniform: ~8 bits a value
    (chunk,) = encode_tensor(x, codec).chunks
    assert len(chunk.data) == chunk.numel
    step = float(x.abs().max()) / 127
    assert (decode_tensor(encode_tensor(x, codec), codec) - x).abs().max() <= step / 2 + 1e-6


def test_int8_coded_chunk_is_bounded_by_its_numel() -> None:
    out = torch.zeros(100)
    codec = get_codec("int8", int8_block=100)
    scales = np.float32(1.0).tobytes()
    bomb = zlib.compress(b"\0" * 10_000)  # inflates far past the 100 values it claims
    for data in (bomb, zlib.compress(b"\1" * 100)[:-3], b"\x78garbage"):
        assert len(data) < 100
        with pytest.raises(InvalidArgument, match="int8 chunk"):
            decode_chunk_into(codec, EncodedChunk(0, 100, data, scales=scales, block=100), out)


def test_topk_keeps_the_largest_of_each_chunk() -> None:
    codec = get_codec("topk", topk_ratio=0.1)
    x = torch.randn(2000)
    y = decode_tensor(encode_tensor(x, codec, chunk_bytes=4000), codec)  # 2 chunks of 1000
    for lo in (0, 1000):
        kept = y[lo : lo + 1000].nonzero().squeeze(1) + lo
        assert len(kept) == 100
        assert set(kept.tolist()) == set((x[lo : lo + 1000].abs().topk(100).indices + lo).tolist())
        assert torch.equal(y[kept], x[kept])


def test_malformed_chunks_are_invalid_arguments() -> None:
    out = torch.zeros(10)
    with pytest.raises(InvalidArgument):
        decode_chunk_into(get_codec("fp32"), EncodedChunk(8, 4, b"\0" * 16), out)  # past the end
    with pytest.raises(InvalidArgument):
        decode_chunk_into(get_codec("fp32"), EncodedChunk(0, 4, b"\0" * 15), out)  # short payload
    with pytest.raises(InvalidArgument):
        decode_chunk_into(
            get_codec("topk"), EncodedChunk(0, 4, b"\0" * 4, indices=(7).to_bytes(4, "little")), out
        )
    with pytest.raises(InvalidArgument, match="unknown compression"):
        get_codec("zip")


@pytest.mark.parametrize("name", ["int8", "topk"])
def test_error_feedback_delivers_everything_eventually(name: str) -> None:
    codec = get_codec(name, topk_ratio=0.05, int8_block=32)
    ef = ErrorFeedback(codec, chunk_bytes=4096)
    torch.manual_seed(0)
    sent = torch.zeros(500)
    total = torch.zeros(500)
    for _ in range(60):
        g = torch.randn(500)
        total += g
        _, decoded, residual = ef.compress(g)
        ef.commit(residual)
        sent += decoded
    # What has not been delivered yet is exactly the carried residual, and it stays bounded.
    assert torch.allclose(total - sent, ef.residual, atol=1e-3)
    assert ef.residual.norm() < total.norm()
