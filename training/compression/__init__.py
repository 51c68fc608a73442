"""What crosses a WAN, made smaller: codecs per chunk, error feedback, delta channels."""

from training.compression.codecs import (
    CODECS,
    Codec,
    EncodedChunk,
    EncodedTensor,
    decode_tensor,
    encode_tensor,
    get_codec,
)
from training.compression.error_feedback import ErrorFeedback

__all__ = [
    "CODECS",
    "Codec",
    "EncodedChunk",
    "EncodedTensor",
    "ErrorFeedback",
    "decode_tensor",
    "encode_tensor",
    "get_codec",
]
