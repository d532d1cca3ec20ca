# Type stub of the C++ extension (python/src/core.cc). Private API.
from typing import Any, Dict, List, Sequence, Tuple

# (name, dtype, shape, address, nbytes, device): device -1 is host memory.
_TensorTuple = Tuple[str, str, Sequence[int], int, int, int]

DTYPES: List[Tuple[str, int]]

def set_log_level(level: str) -> None: ...

class Client:
    @staticmethod
    def connect(
        hub: str, name: str, datacenter: str, rack: str, host: str, reliable: bool,
        data_listen: str, advertise_host: str, rpc_timeout_ms: int,
        connect_timeout_ms: int, heartbeat_interval_ms: int,
        max_serving_connections: int, secret: str, leave_timeout_ms: int,
        metrics_listen: str,
        tls_ca: str, tls_cert: str, tls_key: str, tls_server_name: str,
        data_tls: bool,
    ) -> "Client": ...
    def publish(
        self, model: str, version: int, tensors: Sequence[_TensorTuple], rank: int,
        group_size: int, chunk_bytes: int, timeout_ms: int,
        metadata: Sequence[Tuple[str, str]],
        pieces: Dict[str, Tuple[List[int], List[int]]], segment_bytes: int,
    ) -> None: ...
    def fetch_slices(
        self, model: str, version: int, tensors: Sequence[_TensorTuple],
        boxes: Sequence[Tuple[List[int], List[int]]], scales: Sequence[List[float]],
        timeout_ms: int, connections: int, group: str, group_step: int,
    ) -> Dict[str, Any]: ...
    def unpublish(self, model: str, version: int, timeout_ms: int, force: bool) -> None: ...
    def fetch(
        self, model: str, version: int, tensors: Sequence[_TensorTuple], timeout_ms: int,
        connections: int, serve: bool, group: str, group_step: int,
    ) -> Dict[str, Any]: ...
    def list(self) -> List[Dict[str, Any]]: ...
    def describe(self, model: str, version: int, group: str, group_step: int) -> Dict[str, Any]: ...
    def retain(self, model: str, version: int, retain: bool) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def id(self) -> str: ...
    @property
    def data_address(self) -> str: ...
    @property
    def metrics_address(self) -> str: ...

class Hub:
    @staticmethod
    def start(
        listen: str,
        lease_ms: int,
        secret: str,
        keep_latest: int,
        oversubscribed_racks: bool,
        rebuild_ms: int,
        metrics_listen: str,
        tls_cert: str,
        tls_key: str,
        tls_client_ca: str,
    ) -> "Hub": ...
    @property
    def address(self) -> str: ...
    @property
    def metrics_address(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...

# Resharding helpers (include/tensorhub/reshard.h); a box is (offset, extent).
def classify_hf_tensor(name: str) -> str: ...
def tp_rank_box(
    name: str,
    shape: List[int],
    rank: int,
    tp: int,
    num_attention_heads: int = 0,
    num_key_value_heads: int = 0,
    head_dim: int = 0,
    num_experts: int = 0,
) -> Tuple[List[int], List[int]]: ...
def ep_rank_box(
    name: str, shape: List[int], rank: int, ep: int, num_experts: int
) -> Tuple[List[int], List[int]]: ...
def fsdp_shards(shape: List[int], k: int) -> List[Tuple[List[int], List[int]]]: ...
def tp_shards(shape: List[int], dim: int, k: int) -> List[Tuple[List[int], List[int]]]: ...
def convert(
    from_dtype: str, to_dtype: str, src: int, dst: int, count: int, scale: float = 1.0
) -> None: ...
def fp8_scale(amax: float) -> float: ...
