from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Codec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODEC_UNSPECIFIED: _ClassVar[Codec]
    CODEC_FP32: _ClassVar[Codec]
    CODEC_FP16: _ClassVar[Codec]
    CODEC_BF16: _ClassVar[Codec]
    CODEC_INT8: _ClassVar[Codec]
    CODEC_TOPK: _ClassVar[Codec]
CODEC_UNSPECIFIED: Codec
CODEC_FP32: Codec
CODEC_FP16: Codec
CODEC_BF16: Codec
CODEC_INT8: Codec
CODEC_TOPK: Codec

class TensorSpec(_message.Message):
    __slots__ = ("name", "numel", "codec")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUMEL_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    name: str
    numel: int
    codec: Codec
    def __init__(self, name: _Optional[str] = ..., numel: _Optional[int] = ..., codec: _Optional[_Union[Codec, str]] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("sender", "stream", "round", "parts", "weight", "version", "seq", "base_seq", "fingerprint", "sent_at", "step", "chunks", "step_s", "opened_at")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    BASE_SEQ_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    STEP_S_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    sender: str
    stream: str
    round: int
    parts: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    weight: float
    version: int
    seq: int
    base_seq: int
    fingerprint: str
    sent_at: float
    step: int
    chunks: int
    step_s: float
    opened_at: float
    def __init__(self, sender: _Optional[str] = ..., stream: _Optional[str] = ..., round: _Optional[int] = ..., parts: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., weight: _Optional[float] = ..., version: _Optional[int] = ..., seq: _Optional[int] = ..., base_seq: _Optional[int] = ..., fingerprint: _Optional[str] = ..., sent_at: _Optional[float] = ..., step: _Optional[int] = ..., chunks: _Optional[int] = ..., step_s: _Optional[float] = ..., opened_at: _Optional[float] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("part", "offset", "numel", "data", "scales", "indices", "block")
    PART_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUMEL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SCALES_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    part: int
    offset: int
    numel: int
    data: bytes
    scales: bytes
    indices: bytes
    block: int
    def __init__(self, part: _Optional[int] = ..., offset: _Optional[int] = ..., numel: _Optional[int] = ..., data: _Optional[bytes] = ..., scales: _Optional[bytes] = ..., indices: _Optional[bytes] = ..., block: _Optional[int] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: Header
    chunk: Chunk
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ...) -> None: ...

class PushAck(_message.Message):
    __slots__ = ("receiver", "accepted", "reason", "progress")
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    receiver: str
    accepted: bool
    reason: str
    progress: int
    def __init__(self, receiver: _Optional[str] = ..., accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., progress: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("requester", "what", "min_round")
    REQUESTER_FIELD_NUMBER: _ClassVar[int]
    WHAT_FIELD_NUMBER: _ClassVar[int]
    MIN_ROUND_FIELD_NUMBER: _ClassVar[int]
    requester: str
    what: str
    min_round: int
    def __init__(self, requester: _Optional[str] = ..., what: _Optional[str] = ..., min_round: _Optional[int] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("sender", "address", "ready", "next_round", "progress", "step")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    NEXT_ROUND_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    sender: str
    address: str
    ready: bool
    next_round: int
    progress: int
    step: int
    def __init__(self, sender: _Optional[str] = ..., address: _Optional[str] = ..., ready: _Optional[bool] = ..., next_round: _Optional[int] = ..., progress: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class HelloResponse(_message.Message):
    __slots__ = ("responder", "ready", "progress", "completed", "step", "mode", "accepted", "include_from")
    RESPONDER_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FROM_FIELD_NUMBER: _ClassVar[int]
    responder: str
    ready: bool
    progress: int
    completed: int
    step: int
    mode: str
    accepted: bool
    include_from: int
    def __init__(self, responder: _Optional[str] = ..., ready: _Optional[bool] = ..., progress: _Optional[int] = ..., completed: _Optional[int] = ..., step: _Optional[int] = ..., mode: _Optional[str] = ..., accepted: _Optional[bool] = ..., include_from: _Optional[int] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("sender", "reason")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    sender: str
    reason: str
    def __init__(self, sender: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
