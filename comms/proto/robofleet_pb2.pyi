from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EnrollRequest(_message.Message):
    __slots__ = ("token", "robot_name", "robot_type", "spec_json")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ROBOT_NAME_FIELD_NUMBER: _ClassVar[int]
    ROBOT_TYPE_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    token: str
    robot_name: str
    robot_type: str
    spec_json: str
    def __init__(self, token: _Optional[str] = ..., robot_name: _Optional[str] = ..., robot_type: _Optional[str] = ..., spec_json: _Optional[str] = ...) -> None: ...

class EnrollReply(_message.Message):
    __slots__ = ("robot_id", "robot_name", "credential")
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    ROBOT_NAME_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    robot_id: int
    robot_name: str
    credential: str
    def __init__(self, robot_id: _Optional[int] = ..., robot_name: _Optional[str] = ..., credential: _Optional[str] = ...) -> None: ...

class DataPlane(_message.Message):
    __slots__ = ("endpoint", "token", "curve_server_key")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CURVE_SERVER_KEY_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    token: bytes
    curve_server_key: bytes
    def __init__(self, endpoint: _Optional[str] = ..., token: _Optional[bytes] = ..., curve_server_key: _Optional[bytes] = ...) -> None: ...

class StepBatch(_message.Message):
    __slots__ = ("run_id", "last_seq", "arrow_ipc", "more", "data_plane")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    last_seq: int
    arrow_ipc: bytes
    more: bool
    data_plane: bool
    def __init__(self, run_id: _Optional[str] = ..., last_seq: _Optional[int] = ..., arrow_ipc: _Optional[bytes] = ..., more: _Optional[bool] = ..., data_plane: _Optional[bool] = ...) -> None: ...

class UploadAck(_message.Message):
    __slots__ = ("durable_seq", "backpressure", "retry_after_ms", "reason", "data_plane", "batches")
    DURABLE_SEQ_FIELD_NUMBER: _ClassVar[int]
    BACKPRESSURE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    durable_seq: int
    backpressure: bool
    retry_after_ms: int
    reason: str
    data_plane: DataPlane
    batches: int
    def __init__(self, durable_seq: _Optional[int] = ..., backpressure: _Optional[bool] = ..., retry_after_ms: _Optional[int] = ..., reason: _Optional[str] = ..., data_plane: _Optional[_Union[DataPlane, _Mapping]] = ..., batches: _Optional[int] = ...) -> None: ...

class RouteRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class IngestRoute(_message.Message):
    __slots__ = ("address", "ticket", "shard", "expires_at", "issued_at", "tls")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    address: str
    ticket: str
    shard: int
    expires_at: float
    issued_at: float
    tls: bool
    def __init__(self, address: _Optional[str] = ..., ticket: _Optional[str] = ..., shard: _Optional[int] = ..., expires_at: _Optional[float] = ..., issued_at: _Optional[float] = ..., tls: _Optional[bool] = ...) -> None: ...

class EpisodeMark(_message.Message):
    __slots__ = ("run_id", "episode_index", "kind", "reason")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[EpisodeMark.Kind]
        DISCARD: _ClassVar[EpisodeMark.Kind]
        RERECORD: _ClassVar[EpisodeMark.Kind]
        SUCCESS: _ClassVar[EpisodeMark.Kind]
        FAILURE: _ClassVar[EpisodeMark.Kind]
    KIND_UNSPECIFIED: EpisodeMark.Kind
    DISCARD: EpisodeMark.Kind
    RERECORD: EpisodeMark.Kind
    SUCCESS: EpisodeMark.Kind
    FAILURE: EpisodeMark.Kind
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    episode_index: int
    kind: EpisodeMark.Kind
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., episode_index: _Optional[int] = ..., kind: _Optional[_Union[EpisodeMark.Kind, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class EpisodeMarkAck(_message.Message):
    __slots__ = ("discarded_steps",)
    DISCARDED_STEPS_FIELD_NUMBER: _ClassVar[int]
    discarded_steps: int
    def __init__(self, discarded_steps: _Optional[int] = ...) -> None: ...

class TensorEntry(_message.Message):
    __slots__ = ("name", "dtype", "shape", "encoding")
    class Encoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        FULL: _ClassVar[TensorEntry.Encoding]
        SPARSE: _ClassVar[TensorEntry.Encoding]
    FULL: TensorEntry.Encoding
    SPARSE: TensorEntry.Encoding
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    encoding: TensorEntry.Encoding
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., encoding: _Optional[_Union[TensorEntry.Encoding, str]] = ...) -> None: ...

class Manifest(_message.Message):
    __slots__ = ("run_id", "version", "base_version", "tensors", "changed", "payload_bytes", "chunk_bytes", "chunk_sha256", "learner_step", "chunk_blake3")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SHA256_FIELD_NUMBER: _ClassVar[int]
    LEARNER_STEP_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BLAKE3_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    base_version: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorEntry]
    changed: _containers.RepeatedScalarFieldContainer[str]
    payload_bytes: int
    chunk_bytes: int
    chunk_sha256: _containers.RepeatedScalarFieldContainer[bytes]
    learner_step: int
    chunk_blake3: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., base_version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorEntry, _Mapping]]] = ..., changed: _Optional[_Iterable[str]] = ..., payload_bytes: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., chunk_sha256: _Optional[_Iterable[bytes]] = ..., learner_step: _Optional[int] = ..., chunk_blake3: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("version", "base_version", "index", "data")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    version: int
    base_version: int
    index: int
    data: bytes
    def __init__(self, version: _Optional[int] = ..., base_version: _Optional[int] = ..., index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class WeightMessage(_message.Message):
    __slots__ = ("manifest", "chunk", "data_plane", "chunks_on_data_plane")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_ON_DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    manifest: Manifest
    chunk: Chunk
    data_plane: DataPlane
    chunks_on_data_plane: bool
    def __init__(self, manifest: _Optional[_Union[Manifest, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., data_plane: _Optional[_Union[DataPlane, _Mapping]] = ..., chunks_on_data_plane: _Optional[bool] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("run_id", "have_version", "done_version", "data_plane", "data_plane_failed")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    HAVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DONE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FAILED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    have_version: int
    done_version: int
    data_plane: bool
    data_plane_failed: bool
    def __init__(self, run_id: _Optional[str] = ..., have_version: _Optional[int] = ..., done_version: _Optional[int] = ..., data_plane: _Optional[bool] = ..., data_plane_failed: _Optional[bool] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("run_id", "version", "base_version", "indices", "manifest_only")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_ONLY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    base_version: int
    indices: _containers.RepeatedScalarFieldContainer[int]
    manifest_only: bool
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., base_version: _Optional[int] = ..., indices: _Optional[_Iterable[int]] = ..., manifest_only: _Optional[bool] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("state", "applied_policy_version", "stats", "run_id", "info_json")
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STATE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    state: str
    applied_policy_version: int
    stats: _containers.ScalarMap[str, float]
    run_id: str
    info_json: str
    def __init__(self, state: _Optional[str] = ..., applied_policy_version: _Optional[int] = ..., stats: _Optional[_Mapping[str, float]] = ..., run_id: _Optional[str] = ..., info_json: _Optional[str] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("server_time",)
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    server_time: float
    def __init__(self, server_time: _Optional[float] = ...) -> None: ...

class ControlRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ControlCommand(_message.Message):
    __slots__ = ("kind", "run_id", "reason", "seq", "assignment", "teleop")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NOOP: _ClassVar[ControlCommand.Kind]
        ESTOP: _ClassVar[ControlCommand.Kind]
        PAUSE: _ClassVar[ControlCommand.Kind]
        RESUME: _ClassVar[ControlCommand.Kind]
        LEASE_CHANGED: _ClassVar[ControlCommand.Kind]
        CLEAR_ESTOP: _ClassVar[ControlCommand.Kind]
        ASSIGN: _ClassVar[ControlCommand.Kind]
        RELEASE: _ClassVar[ControlCommand.Kind]
        RERECORD: _ClassVar[ControlCommand.Kind]
        DISCARD: _ClassVar[ControlCommand.Kind]
        READY: _ClassVar[ControlCommand.Kind]
        HELP_ANSWERED: _ClassVar[ControlCommand.Kind]
        TELEOP: _ClassVar[ControlCommand.Kind]
    NOOP: ControlCommand.Kind
    ESTOP: ControlCommand.Kind
    PAUSE: ControlCommand.Kind
    RESUME: ControlCommand.Kind
    LEASE_CHANGED: ControlCommand.Kind
    CLEAR_ESTOP: ControlCommand.Kind
    ASSIGN: ControlCommand.Kind
    RELEASE: ControlCommand.Kind
    RERECORD: ControlCommand.Kind
    DISCARD: ControlCommand.Kind
    READY: ControlCommand.Kind
    HELP_ANSWERED: ControlCommand.Kind
    TELEOP: ControlCommand.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    TELEOP_FIELD_NUMBER: _ClassVar[int]
    kind: ControlCommand.Kind
    run_id: str
    reason: str
    seq: int
    assignment: str
    teleop: str
    def __init__(self, kind: _Optional[_Union[ControlCommand.Kind, str]] = ..., run_id: _Optional[str] = ..., reason: _Optional[str] = ..., seq: _Optional[int] = ..., assignment: _Optional[str] = ..., teleop: _Optional[str] = ...) -> None: ...

class StationReport(_message.Message):
    __slots__ = ("run_id", "frame", "frame_format", "camera", "taken_over", "echo_id", "note")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    FRAME_FORMAT_FIELD_NUMBER: _ClassVar[int]
    CAMERA_FIELD_NUMBER: _ClassVar[int]
    TAKEN_OVER_FIELD_NUMBER: _ClassVar[int]
    ECHO_ID_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    frame: bytes
    frame_format: str
    camera: str
    taken_over: bool
    echo_id: int
    note: str
    def __init__(self, run_id: _Optional[str] = ..., frame: _Optional[bytes] = ..., frame_format: _Optional[str] = ..., camera: _Optional[str] = ..., taken_over: _Optional[bool] = ..., echo_id: _Optional[int] = ..., note: _Optional[str] = ...) -> None: ...

class StationReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ActRequest(_message.Message):
    __slots__ = ("run_id", "observation", "task")
    class ObservationEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    observation: _containers.MessageMap[str, Tensor]
    task: str
    def __init__(self, run_id: _Optional[str] = ..., observation: _Optional[_Mapping[str, Tensor]] = ..., task: _Optional[str] = ...) -> None: ...

class ActReply(_message.Message):
    __slots__ = ("action", "policy_version")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    action: Tensor
    policy_version: int
    def __init__(self, action: _Optional[_Union[Tensor, _Mapping]] = ..., policy_version: _Optional[int] = ...) -> None: ...
