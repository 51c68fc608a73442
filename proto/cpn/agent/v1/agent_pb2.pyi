from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_STARTING: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_SUCCEEDED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_CANCELLED: _ClassVar[TaskState]
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_STARTING: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_SUCCEEDED: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_CANCELLED: TaskState

class Device(_message.Message):
    __slots__ = ("index", "model", "memory_gb", "measured_tflops", "kind", "uuid", "nvlink_island")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    MEASURED_TFLOPS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NVLINK_ISLAND_FIELD_NUMBER: _ClassVar[int]
    index: int
    model: str
    memory_gb: float
    measured_tflops: float
    kind: str
    uuid: str
    nvlink_island: int
    def __init__(self, index: _Optional[int] = ..., model: _Optional[str] = ..., memory_gb: _Optional[float] = ..., measured_tflops: _Optional[float] = ..., kind: _Optional[str] = ..., uuid: _Optional[str] = ..., nvlink_island: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("enrollment_token", "region", "cluster", "provider", "hostname", "devices", "price_per_device_hour", "spot_price_per_device_hour", "agent_version", "advertise_host", "sync_port_min", "sync_port_max", "intra_bandwidth_gbps", "jurisdiction", "node_id", "node_token", "probe_port", "checkpoint_port", "measured_profile", "node_fabric_gbps", "node_fabric_latency_ms", "cross_cluster_host", "cpu_contention", "cpu_contention_probe_ages_s", "csr_pem", "sandbox", "profile_follows")
    ENROLLMENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_DEVICE_HOUR_FIELD_NUMBER: _ClassVar[int]
    SPOT_PRICE_PER_DEVICE_HOUR_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ADVERTISE_HOST_FIELD_NUMBER: _ClassVar[int]
    SYNC_PORT_MIN_FIELD_NUMBER: _ClassVar[int]
    SYNC_PORT_MAX_FIELD_NUMBER: _ClassVar[int]
    INTRA_BANDWIDTH_GBPS_FIELD_NUMBER: _ClassVar[int]
    JURISDICTION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROBE_PORT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PORT_FIELD_NUMBER: _ClassVar[int]
    MEASURED_PROFILE_FIELD_NUMBER: _ClassVar[int]
    NODE_FABRIC_GBPS_FIELD_NUMBER: _ClassVar[int]
    NODE_FABRIC_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    CROSS_CLUSTER_HOST_FIELD_NUMBER: _ClassVar[int]
    CPU_CONTENTION_FIELD_NUMBER: _ClassVar[int]
    CPU_CONTENTION_PROBE_AGES_S_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FOLLOWS_FIELD_NUMBER: _ClassVar[int]
    enrollment_token: str
    region: str
    cluster: str
    provider: str
    hostname: str
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    price_per_device_hour: float
    spot_price_per_device_hour: float
    agent_version: str
    advertise_host: str
    sync_port_min: int
    sync_port_max: int
    intra_bandwidth_gbps: float
    jurisdiction: str
    node_id: str
    node_token: str
    probe_port: int
    checkpoint_port: int
    measured_profile: MeasuredProfile
    node_fabric_gbps: float
    node_fabric_latency_ms: float
    cross_cluster_host: str
    cpu_contention: float
    cpu_contention_probe_ages_s: _containers.RepeatedScalarFieldContainer[float]
    csr_pem: str
    sandbox: str
    profile_follows: bool
    def __init__(self, enrollment_token: _Optional[str] = ..., region: _Optional[str] = ..., cluster: _Optional[str] = ..., provider: _Optional[str] = ..., hostname: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., price_per_device_hour: _Optional[float] = ..., spot_price_per_device_hour: _Optional[float] = ..., agent_version: _Optional[str] = ..., advertise_host: _Optional[str] = ..., sync_port_min: _Optional[int] = ..., sync_port_max: _Optional[int] = ..., intra_bandwidth_gbps: _Optional[float] = ..., jurisdiction: _Optional[str] = ..., node_id: _Optional[str] = ..., node_token: _Optional[str] = ..., probe_port: _Optional[int] = ..., checkpoint_port: _Optional[int] = ..., measured_profile: _Optional[_Union[MeasuredProfile, _Mapping]] = ..., node_fabric_gbps: _Optional[float] = ..., node_fabric_latency_ms: _Optional[float] = ..., cross_cluster_host: _Optional[str] = ..., cpu_contention: _Optional[float] = ..., cpu_contention_probe_ages_s: _Optional[_Iterable[float]] = ..., csr_pem: _Optional[str] = ..., sandbox: _Optional[str] = ..., profile_follows: _Optional[bool] = ...) -> None: ...

class MeasuredProfile(_message.Message):
    __slots__ = ("startup_s", "teardown_s", "physical_cores", "rates", "host_load_factor", "launcher_s", "collective_call_s", "collective_gbps", "collective_wait_s")
    STARTUP_S_FIELD_NUMBER: _ClassVar[int]
    TEARDOWN_S_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_CORES_FIELD_NUMBER: _ClassVar[int]
    RATES_FIELD_NUMBER: _ClassVar[int]
    HOST_LOAD_FACTOR_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_S_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_CALL_S_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_GBPS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    startup_s: float
    teardown_s: float
    physical_cores: int
    rates: _containers.RepeatedCompositeFieldContainer[MeasuredStepRate]
    host_load_factor: float
    launcher_s: float
    collective_call_s: float
    collective_gbps: float
    collective_wait_s: float
    def __init__(self, startup_s: _Optional[float] = ..., teardown_s: _Optional[float] = ..., physical_cores: _Optional[int] = ..., rates: _Optional[_Iterable[_Union[MeasuredStepRate, _Mapping]]] = ..., host_load_factor: _Optional[float] = ..., launcher_s: _Optional[float] = ..., collective_call_s: _Optional[float] = ..., collective_gbps: _Optional[float] = ..., collective_wait_s: _Optional[float] = ...) -> None: ...

class MeasuredStepRate(_message.Message):
    __slots__ = ("precision", "tflops", "micro_batch_s", "step_s", "optimizer_s_per_mparam", "data_s_per_mtoken", "checkpoint_s_per_mparam")
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    TFLOPS_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_S_FIELD_NUMBER: _ClassVar[int]
    STEP_S_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_S_PER_MPARAM_FIELD_NUMBER: _ClassVar[int]
    DATA_S_PER_MTOKEN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_S_PER_MPARAM_FIELD_NUMBER: _ClassVar[int]
    precision: str
    tflops: float
    micro_batch_s: float
    step_s: float
    optimizer_s_per_mparam: float
    data_s_per_mtoken: float
    checkpoint_s_per_mparam: float
    def __init__(self, precision: _Optional[str] = ..., tflops: _Optional[float] = ..., micro_batch_s: _Optional[float] = ..., step_s: _Optional[float] = ..., optimizer_s_per_mparam: _Optional[float] = ..., data_s_per_mtoken: _Optional[float] = ..., checkpoint_s_per_mparam: _Optional[float] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("node_id", "node_token", "cluster_id", "heartbeat_interval_s", "probe_key", "node_certificate_pem", "store_probe")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    PROBE_KEY_FIELD_NUMBER: _ClassVar[int]
    NODE_CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    STORE_PROBE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    node_token: str
    cluster_id: str
    heartbeat_interval_s: float
    probe_key: str
    node_certificate_pem: str
    store_probe: StoreProbe
    def __init__(self, node_id: _Optional[str] = ..., node_token: _Optional[str] = ..., cluster_id: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., probe_key: _Optional[str] = ..., node_certificate_pem: _Optional[str] = ..., store_probe: _Optional[_Union[StoreProbe, _Mapping]] = ...) -> None: ...

class StoreProbe(_message.Message):
    __slots__ = ("blobs",)
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    blobs: _containers.RepeatedCompositeFieldContainer[StoreProbeBlob]
    def __init__(self, blobs: _Optional[_Iterable[_Union[StoreProbeBlob, _Mapping]]] = ...) -> None: ...

class StoreProbeBlob(_message.Message):
    __slots__ = ("url", "digest", "bytes")
    URL_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    url: str
    digest: str
    bytes: int
    def __init__(self, url: _Optional[str] = ..., digest: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "heartbeat", "inventory", "task_status", "metrics", "log", "probe_result", "checkpoint_copy_result", "staging_probe", "cache", "profile", "capacity")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    TASK_STATUS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    PROBE_RESULT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_COPY_RESULT_FIELD_NUMBER: _ClassVar[int]
    STAGING_PROBE_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    heartbeat: Heartbeat
    inventory: Inventory
    task_status: TaskStatus
    metrics: TaskMetrics
    log: TaskLog
    probe_result: LinkProbeResult
    checkpoint_copy_result: CheckpointCopyResult
    staging_probe: StagingProbeResult
    cache: CacheReport
    profile: ProfileReport
    capacity: Capacity
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., inventory: _Optional[_Union[Inventory, _Mapping]] = ..., task_status: _Optional[_Union[TaskStatus, _Mapping]] = ..., metrics: _Optional[_Union[TaskMetrics, _Mapping]] = ..., log: _Optional[_Union[TaskLog, _Mapping]] = ..., probe_result: _Optional[_Union[LinkProbeResult, _Mapping]] = ..., checkpoint_copy_result: _Optional[_Union[CheckpointCopyResult, _Mapping]] = ..., staging_probe: _Optional[_Union[StagingProbeResult, _Mapping]] = ..., cache: _Optional[_Union[CacheReport, _Mapping]] = ..., profile: _Optional[_Union[ProfileReport, _Mapping]] = ..., capacity: _Optional[_Union[Capacity, _Mapping]] = ...) -> None: ...

class ProfileReport(_message.Message):
    __slots__ = ("measured_profile", "error", "cpu_contention", "cpu_contention_probe_ages_s")
    MEASURED_PROFILE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CPU_CONTENTION_FIELD_NUMBER: _ClassVar[int]
    CPU_CONTENTION_PROBE_AGES_S_FIELD_NUMBER: _ClassVar[int]
    measured_profile: MeasuredProfile
    error: str
    cpu_contention: float
    cpu_contention_probe_ages_s: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, measured_profile: _Optional[_Union[MeasuredProfile, _Mapping]] = ..., error: _Optional[str] = ..., cpu_contention: _Optional[float] = ..., cpu_contention_probe_ages_s: _Optional[_Iterable[float]] = ...) -> None: ...

class StagingProbeResult(_message.Message):
    __slots__ = ("fetch_fixed_s", "bytes_per_s", "probe_bytes", "venv_s", "error")
    FETCH_FIXED_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    PROBE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VENV_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    fetch_fixed_s: float
    bytes_per_s: float
    probe_bytes: int
    venv_s: float
    error: str
    def __init__(self, fetch_fixed_s: _Optional[float] = ..., bytes_per_s: _Optional[float] = ..., probe_bytes: _Optional[int] = ..., venv_s: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class CacheReport(_message.Message):
    __slots__ = ("blobs", "venvs")
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    VENVS_FIELD_NUMBER: _ClassVar[int]
    blobs: _containers.RepeatedScalarFieldContainer[str]
    venvs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, blobs: _Optional[_Iterable[str]] = ..., venvs: _Optional[_Iterable[str]] = ...) -> None: ...

class Capacity(_message.Message):
    __slots__ = ("devices_unavailable", "queue_wait_s")
    DEVICES_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    devices_unavailable: int
    queue_wait_s: float
    def __init__(self, devices_unavailable: _Optional[int] = ..., queue_wait_s: _Optional[float] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node_id", "node_token", "running_assignments")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUNNING_ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    node_token: str
    running_assignments: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., node_token: _Optional[str] = ..., running_assignments: _Optional[_Iterable[str]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("seq", "sent_at", "load", "cpu_contention", "cpu_contention_probe_ages_s", "devices", "node_health")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    CPU_CONTENTION_FIELD_NUMBER: _ClassVar[int]
    CPU_CONTENTION_PROBE_AGES_S_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    NODE_HEALTH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    sent_at: float
    load: float
    cpu_contention: float
    cpu_contention_probe_ages_s: _containers.RepeatedScalarFieldContainer[float]
    devices: _containers.RepeatedCompositeFieldContainer[DeviceSample]
    node_health: str
    def __init__(self, seq: _Optional[int] = ..., sent_at: _Optional[float] = ..., load: _Optional[float] = ..., cpu_contention: _Optional[float] = ..., cpu_contention_probe_ages_s: _Optional[_Iterable[float]] = ..., devices: _Optional[_Iterable[_Union[DeviceSample, _Mapping]]] = ..., node_health: _Optional[str] = ...) -> None: ...

class DeviceSample(_message.Message):
    __slots__ = ("index", "utilization", "memory_used_gb", "power_w", "temperature_c", "health")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_GB_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    index: int
    utilization: float
    memory_used_gb: float
    power_w: float
    temperature_c: float
    health: str
    def __init__(self, index: _Optional[int] = ..., utilization: _Optional[float] = ..., memory_used_gb: _Optional[float] = ..., power_w: _Optional[float] = ..., temperature_c: _Optional[float] = ..., health: _Optional[str] = ...) -> None: ...

class Inventory(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    def __init__(self, devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ...) -> None: ...

class TaskStatus(_message.Message):
    __slots__ = ("assignment_id", "state", "message", "exit_code", "result_json", "lost")
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    state: TaskState
    message: str
    exit_code: int
    result_json: str
    lost: bool
    def __init__(self, assignment_id: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., message: _Optional[str] = ..., exit_code: _Optional[int] = ..., result_json: _Optional[str] = ..., lost: _Optional[bool] = ...) -> None: ...

class TaskMetrics(_message.Message):
    __slots__ = ("assignment_id", "step", "total_steps", "loss", "tokens_per_s", "compute_utilization", "wan_bytes_sent", "wan_bytes_recv", "sync_latency_s", "wall_time_s", "data_s", "compute_s", "optimizer_s", "sync_s", "checkpoint_s", "step_wall_s", "checkpoint_step", "gossip_spread", "wan_wire_bytes_sent", "job_step")
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    WAN_BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    WAN_BYTES_RECV_FIELD_NUMBER: _ClassVar[int]
    SYNC_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    WALL_TIME_S_FIELD_NUMBER: _ClassVar[int]
    DATA_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_S_FIELD_NUMBER: _ClassVar[int]
    SYNC_S_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_S_FIELD_NUMBER: _ClassVar[int]
    STEP_WALL_S_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    GOSSIP_SPREAD_FIELD_NUMBER: _ClassVar[int]
    WAN_WIRE_BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    JOB_STEP_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    step: int
    total_steps: int
    loss: float
    tokens_per_s: float
    compute_utilization: float
    wan_bytes_sent: int
    wan_bytes_recv: int
    sync_latency_s: float
    wall_time_s: float
    data_s: float
    compute_s: float
    optimizer_s: float
    sync_s: float
    checkpoint_s: float
    step_wall_s: float
    checkpoint_step: int
    gossip_spread: float
    wan_wire_bytes_sent: int
    job_step: float
    def __init__(self, assignment_id: _Optional[str] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., loss: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., compute_utilization: _Optional[float] = ..., wan_bytes_sent: _Optional[int] = ..., wan_bytes_recv: _Optional[int] = ..., sync_latency_s: _Optional[float] = ..., wall_time_s: _Optional[float] = ..., data_s: _Optional[float] = ..., compute_s: _Optional[float] = ..., optimizer_s: _Optional[float] = ..., sync_s: _Optional[float] = ..., checkpoint_s: _Optional[float] = ..., step_wall_s: _Optional[float] = ..., checkpoint_step: _Optional[int] = ..., gossip_spread: _Optional[float] = ..., wan_wire_bytes_sent: _Optional[int] = ..., job_step: _Optional[float] = ...) -> None: ...

class TaskLog(_message.Message):
    __slots__ = ("assignment_id", "stream", "line")
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    stream: str
    line: str
    def __init__(self, assignment_id: _Optional[str] = ..., stream: _Optional[str] = ..., line: _Optional[str] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("assignment", "cancel", "drain", "ack", "probe", "checkpoint_copy", "peer_lost", "preempt")
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_COPY_FIELD_NUMBER: _ClassVar[int]
    PEER_LOST_FIELD_NUMBER: _ClassVar[int]
    PREEMPT_FIELD_NUMBER: _ClassVar[int]
    assignment: Assignment
    cancel: Cancel
    drain: Drain
    ack: Ack
    probe: LinkProbeOrder
    checkpoint_copy: CheckpointCopyOrder
    peer_lost: PeerLost
    preempt: Preempt
    def __init__(self, assignment: _Optional[_Union[Assignment, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., probe: _Optional[_Union[LinkProbeOrder, _Mapping]] = ..., checkpoint_copy: _Optional[_Union[CheckpointCopyOrder, _Mapping]] = ..., peer_lost: _Optional[_Union[PeerLost, _Mapping]] = ..., preempt: _Optional[_Union[Preempt, _Mapping]] = ...) -> None: ...

class Preempt(_message.Message):
    __slots__ = ("assignment_id", "reason", "grace_s")
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    reason: str
    grace_s: float
    def __init__(self, assignment_id: _Optional[str] = ..., reason: _Optional[str] = ..., grace_s: _Optional[float] = ...) -> None: ...

class PeerLost(_message.Message):
    __slots__ = ("assignment_id", "participant", "address", "reason")
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    participant: str
    address: str
    reason: str
    def __init__(self, assignment_id: _Optional[str] = ..., participant: _Optional[str] = ..., address: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("assignment_id", "job_id", "attempt", "device_indices", "nproc", "worker_config_json")
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDICES_FIELD_NUMBER: _ClassVar[int]
    NPROC_FIELD_NUMBER: _ClassVar[int]
    WORKER_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    job_id: str
    attempt: int
    device_indices: _containers.RepeatedScalarFieldContainer[int]
    nproc: int
    worker_config_json: str
    def __init__(self, assignment_id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., device_indices: _Optional[_Iterable[int]] = ..., nproc: _Optional[int] = ..., worker_config_json: _Optional[str] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("assignment_id", "reason")
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    reason: str
    def __init__(self, assignment_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("node_id", "heartbeat_interval_s")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    heartbeat_interval_s: float
    def __init__(self, node_id: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class LinkProbeTicket(_message.Message):
    __slots__ = ("probe_id", "target_node_id", "bulk_bytes", "echoes", "expires_at", "mac")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    BULK_BYTES_FIELD_NUMBER: _ClassVar[int]
    ECHOES_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    target_node_id: str
    bulk_bytes: int
    echoes: int
    expires_at: float
    mac: str
    def __init__(self, probe_id: _Optional[str] = ..., target_node_id: _Optional[str] = ..., bulk_bytes: _Optional[int] = ..., echoes: _Optional[int] = ..., expires_at: _Optional[float] = ..., mac: _Optional[str] = ...) -> None: ...

class LinkProbeOrder(_message.Message):
    __slots__ = ("ticket", "target_host", "target_port")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    TARGET_HOST_FIELD_NUMBER: _ClassVar[int]
    TARGET_PORT_FIELD_NUMBER: _ClassVar[int]
    ticket: LinkProbeTicket
    target_host: str
    target_port: int
    def __init__(self, ticket: _Optional[_Union[LinkProbeTicket, _Mapping]] = ..., target_host: _Optional[str] = ..., target_port: _Optional[int] = ...) -> None: ...

class LinkProbeEcho(_message.Message):
    __slots__ = ("ticket", "seq")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ticket: LinkProbeTicket
    seq: int
    def __init__(self, ticket: _Optional[_Union[LinkProbeTicket, _Mapping]] = ..., seq: _Optional[int] = ...) -> None: ...

class LinkProbeChunk(_message.Message):
    __slots__ = ("ticket", "data")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ticket: LinkProbeTicket
    data: bytes
    def __init__(self, ticket: _Optional[_Union[LinkProbeTicket, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class LinkProbeBulkReply(_message.Message):
    __slots__ = ("bytes", "timed_bytes", "span_s")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPAN_S_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    timed_bytes: int
    span_s: float
    def __init__(self, bytes: _Optional[int] = ..., timed_bytes: _Optional[int] = ..., span_s: _Optional[float] = ...) -> None: ...

class LinkProbeResult(_message.Message):
    __slots__ = ("probe_id", "rtt_ms", "bulk_bytes", "bulk_s", "duration_s", "error")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    BULK_BYTES_FIELD_NUMBER: _ClassVar[int]
    BULK_S_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    rtt_ms: float
    bulk_bytes: int
    bulk_s: float
    duration_s: float
    error: str
    def __init__(self, probe_id: _Optional[str] = ..., rtt_ms: _Optional[float] = ..., bulk_bytes: _Optional[int] = ..., bulk_s: _Optional[float] = ..., duration_s: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class CheckpointTicket(_message.Message):
    __slots__ = ("transfer_id", "source_node_id", "dir", "step", "max_bytes", "expires_at", "mac")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DIR_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    source_node_id: str
    dir: str
    step: int
    max_bytes: int
    expires_at: float
    mac: str
    def __init__(self, transfer_id: _Optional[str] = ..., source_node_id: _Optional[str] = ..., dir: _Optional[str] = ..., step: _Optional[int] = ..., max_bytes: _Optional[int] = ..., expires_at: _Optional[float] = ..., mac: _Optional[str] = ...) -> None: ...

class CheckpointFetchRequest(_message.Message):
    __slots__ = ("ticket",)
    TICKET_FIELD_NUMBER: _ClassVar[int]
    ticket: CheckpointTicket
    def __init__(self, ticket: _Optional[_Union[CheckpointTicket, _Mapping]] = ...) -> None: ...

class CheckpointFile(_message.Message):
    __slots__ = ("path", "size", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    sha256: str
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class CheckpointChunk(_message.Message):
    __slots__ = ("manifest", "file", "data")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    manifest: _containers.RepeatedCompositeFieldContainer[CheckpointFile]
    file: int
    data: bytes
    def __init__(self, manifest: _Optional[_Iterable[_Union[CheckpointFile, _Mapping]]] = ..., file: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class CheckpointCopyOrder(_message.Message):
    __slots__ = ("ticket", "source_host", "source_port", "job_id", "tls")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    SOURCE_HOST_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PORT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    ticket: CheckpointTicket
    source_host: str
    source_port: int
    job_id: str
    tls: CheckpointTls
    def __init__(self, ticket: _Optional[_Union[CheckpointTicket, _Mapping]] = ..., source_host: _Optional[str] = ..., source_port: _Optional[int] = ..., job_id: _Optional[str] = ..., tls: _Optional[_Union[CheckpointTls, _Mapping]] = ...) -> None: ...

class CheckpointTls(_message.Message):
    __slots__ = ("ca_pem", "cert_pem", "key_pem")
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    CERT_PEM_FIELD_NUMBER: _ClassVar[int]
    KEY_PEM_FIELD_NUMBER: _ClassVar[int]
    ca_pem: str
    cert_pem: str
    key_pem: str
    def __init__(self, ca_pem: _Optional[str] = ..., cert_pem: _Optional[str] = ..., key_pem: _Optional[str] = ...) -> None: ...

class CheckpointCopyResult(_message.Message):
    __slots__ = ("transfer_id", "bytes", "duration_s", "error", "assignment_id")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    bytes: int
    duration_s: float
    error: str
    assignment_id: str
    def __init__(self, transfer_id: _Optional[str] = ..., bytes: _Optional[int] = ..., duration_s: _Optional[float] = ..., error: _Optional[str] = ..., assignment_id: _Optional[str] = ...) -> None: ...
