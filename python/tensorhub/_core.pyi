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
        tls_ca: str, tls_cert: str, tls_key: str, tls_server_name: str,
        data_tls: bool,
    ) -> "Client": ...
    def publish(
        self, model: str, version: int, tensors: Sequence[_TensorTuple], rank: int,
        group_size: int, chunk_bytes: int, timeout_ms: int,
        metadata: Sequence[Tuple[str, str]],
    ) -> None: ...
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

class Hub:
    @staticmethod
    def start(
        listen: str,
        lease_ms: int,
        secret: str,
        keep_latest: int,
        oversubscribed_racks: bool,
        rebuild_ms: int,
        tls_cert: str,
        tls_key: str,
        tls_client_ca: str,
    ) -> "Hub": ...
    @property
    def address(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
