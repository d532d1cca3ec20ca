"""One host copy per node: engines load from the node agent of their host.

A host runs one agent, ``tensorhub node`` (started by the deployment before
the engines: a systemd unit, a DaemonSet, a per-node Ray actor). It is a
TensorHub worker like any other, so it takes part in the fan-out as one
reader per host and serves other hosts, and it holds one copy of each
version in shared memory for the engines of its host, however many they are.

An engine asks it for a version with :func:`acquire` and gets a
:class:`NodeCopy`: the version's tensors as views of that memory (mapped
copy-on-write: reading costs the host nothing more, a write stays the
engine's own), to load straight from, e.g. ``model.load_weights(copy.items())``.
Then it closes the copy. The agent never writes into a copy it handed out
(a newer version goes into new memory), so a view never sees a mix of two
versions, and it stays valid after the agent is gone.

When no agent answers (none started, or it died, also mid-request) or the
agent says it cannot serve a request (it holds a newer version already, its
copy is still held by others past its wait, the version is over its memory
limit), :func:`acquire` raises :class:`NodeUnavailable`: the engine then
fetches the version itself, as it would without an agent::

    from tensorhub import node
    try:
        with node.acquire("policy", 7) as copy:
            model.load_weights(copy.items())
    except node.NodeUnavailable as e:
        log.warning("fetching policy@7 myself: %s", e)
        ...  # client.fetch(...)

Everything here is pure Python (sockets, mmap, numpy or torch views): an
engine that only loads from its agent never loads TensorHub's native
library. ``$TENSORHUB_NODE`` (or the ``socket`` argument) names the agent's
socket: ``@NAME`` for an abstract socket (one per network namespace, the
default ``@tensorhub-node``), else a path.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import socket as _socket
import struct
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from .errors import (
    DeadlineExceededError,
    Error,
    InvalidArgumentError,
    UnavailableError,
    _from_status,
)

logger = logging.getLogger(__name__)

DEFAULT_SOCKET = "@tensorhub-node"
_MAX_REPLY_BYTES = 256 << 20
_PROTOCOL = 1
# Linux madvise(2): populate page tables for reading, without breaking
# copy-on-write (unlike MAP_POPULATE on a private writable mapping).
_MADV_POPULATE_READ = 22


class NodeUnavailable(UnavailableError):
    """The node agent cannot serve this request: fetch the version yourself.

    Raised when no agent listens at the socket, when it closes the
    connection mid-request (it died or stopped), or when it answers that
    this engine should fetch for itself (``fallback`` in its reply).
    """


def socket_name(socket: Optional[str] = None) -> str:
    """The agent's socket: ``socket``, else ``$TENSORHUB_NODE``, else the default."""
    return socket or os.environ.get("TENSORHUB_NODE") or DEFAULT_SOCKET


def _address(name: str) -> str:
    if name.startswith("@"):
        return "\0" + name[1:]
    return name


class _Connection:
    """One session with the agent: length-prefixed JSON, descriptors alongside."""

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name = name
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        try:
            self.sock.connect(_address(name))
        except OSError as e:
            self.sock.close()
            raise NodeUnavailable(f"no node agent at {name}: {e}") from None

    def close(self) -> None:
        self.sock.close()

    def request(self, message: Dict[str, Any], timeout_s: float) -> Tuple[Dict[str, Any], Optional[int]]:
        body = json.dumps(message).encode()
        try:
            self.sock.settimeout(timeout_s)
            self.sock.sendall(struct.pack("<I", len(body)) + body)
            return self._receive(time.monotonic() + timeout_s)
        except _socket.timeout:
            raise DeadlineExceededError(
                f"the node agent at {self.name} did not answer {message.get('op')} "
                f"within {timeout_s:.1f} s"
            ) from None
        except (ConnectionError, OSError) as e:
            raise NodeUnavailable(f"the node agent at {self.name} went away: {e}") from None

    def _receive(self, deadline: float) -> Tuple[Dict[str, Any], Optional[int]]:
        fds: List[int] = []
        header = self._read(4, deadline, fds)
        (n,) = struct.unpack("<I", header)
        if n > _MAX_REPLY_BYTES:
            for fd in fds:
                os.close(fd)
            raise NodeUnavailable(f"the node agent at {self.name} sent a {n}-byte reply")
        body = self._read(n, deadline, fds)
        for fd in fds[1:]:
            os.close(fd)
        try:
            reply = json.loads(body)
        except ValueError:
            for fd in fds[:1]:
                os.close(fd)
            raise NodeUnavailable(f"the node agent at {self.name} sent a malformed reply") from None
        return reply, (fds[0] if fds else None)

    def _read(self, n: int, deadline: float, fds: List[int]) -> bytes:
        out = bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _socket.timeout()
            self.sock.settimeout(left)
            data, got_fds, _, _ = _socket.recv_fds(self.sock, n - len(out), 4)
            fds.extend(got_fds)
            if not data:
                raise ConnectionError("closed")
            out += data
        return bytes(out)


def _check(reply: Dict[str, Any], name: str) -> Dict[str, Any]:
    if reply.get("ok"):
        return reply
    message = f"node agent at {name}: {reply.get('message', '')}"
    if reply.get("fallback"):
        raise NodeUnavailable(message)
    code = reply.get("code", "UNKNOWN")
    from .errors import StatusCode

    number = StatusCode[code].value if code in StatusCode.__members__ else 2
    raise _from_status(number, code, message)


def _version_field(version: Union[int, str]) -> Union[int, str]:
    if version == "latest":
        return "latest"
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidArgumentError(f"version must be an integer >= 1 or 'latest', not {version!r}")
    return version


def _request(op: str, model: str, version: Union[int, str], group: Optional[str],
             step: Optional[int], timeout_s: float) -> Dict[str, Any]:
    if not isinstance(model, str) or not model:
        raise InvalidArgumentError(f"model must be a non-empty string, not {model!r}")
    msg: Dict[str, Any] = {
        "op": op,
        "model": model,
        "version": _version_field(version),
        "timeout_ms": max(1, int(timeout_s * 1000)),
    }
    if group:
        msg["group"] = str(group)
        msg["step"] = int(step or 0)
    return msg


class NodeCopy:
    """The host copy of one version, as this engine holds it (see module doc).

    Attributes:
        model, version: what it is.
        nbytes: bytes of the shared memory.
        metadata: the version's text metadata (``tensorhub.torch``'s aliases
            among them); ``binary_metadata_keys`` names the others.
        holder: the agent's worker id.
        fetched_now: this request made the agent fetch it.
    """

    def __init__(self, conn: _Connection, reply: Dict[str, Any], fd: int) -> None:
        self._conn: Optional[_Connection] = conn
        self.model: str = reply["model"]
        self.version: int = int(reply["version"])
        self.nbytes: int = int(reply["bytes"])
        self.holder: str = reply.get("holder", "")
        self.fetched_now: bool = bool(reply.get("fetched_now", False))
        self.metadata: Dict[str, str] = {k: v for k, v in reply.get("metadata", [])}
        self.binary_metadata_keys: List[str] = list(reply.get("binary_metadata_keys", []))
        self._tensors: List[Tuple[str, str, List[int], int, int]] = [
            (t[0], t[1], list(t[2]), int(t[3]), int(t[4])) for t in reply["tensors"]
        ]
        try:
            # Private and writable: reads share the agent's pages; a write
            # (a loader that scales in place) copies that page for this
            # engine alone. The descriptor is read-only: nothing here can
            # change the host copy.
            self._map = mmap.mmap(fd, max(self.nbytes, 1), flags=mmap.MAP_PRIVATE,
                                  prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        try:
            self._map.madvise(_MADV_POPULATE_READ)
        except (OSError, ValueError):  # kernels before 5.14: faults as it reads
            pass

    # -- the tensors ---------------------------------------------------------

    @property
    def names(self) -> List[str]:
        return [t[0] for t in self._tensors]

    def tensors(self, kind: str = "torch") -> Dict[str, Any]:
        """Every tensor, by name, as views of the copy: ``"torch"`` tensors
        (every dtype) or ``"numpy"`` arrays (dtypes numpy has; bfloat16 and
        float8 as same-width unsigned integers)."""
        return dict(self.items(kind))

    def items(self, kind: str = "torch") -> Iterator[Tuple[str, Any]]:
        """``(name, view)`` in the copy's layout order, for a loader that takes
        an iterator (``model.load_weights(copy.items())``)."""
        if kind not in ("torch", "numpy"):
            raise InvalidArgumentError(f"kind must be 'torch' or 'numpy', not {kind!r}")
        for name, dtype, shape, offset, nbytes in self._tensors:
            yield name, self._view(kind, dtype, shape, offset, nbytes)

    def _view(self, kind: str, dtype: str, shape: List[int], offset: int, nbytes: int) -> Any:
        from ._tensors import DTYPE_BYTES

        count = nbytes // DTYPE_BYTES[dtype]
        if kind == "torch":
            import torch

            from ._tensors import torch_dtype_for

            if count == 0:
                return torch.empty(shape, dtype=torch_dtype_for(dtype))
            return torch.frombuffer(self._map, dtype=torch_dtype_for(dtype), count=count,
                                    offset=offset).view(shape)
        import numpy as np

        from ._tensors import _NAME_TO_NUMPY

        np_dtype = _NAME_TO_NUMPY.get(dtype) or np.dtype(f"uint{8 * DTYPE_BYTES[dtype]}")
        return np.frombuffer(self._map, dtype=np_dtype, count=count, offset=offset).reshape(shape)

    # -- the session ---------------------------------------------------------

    def close(self) -> None:
        """Ends this engine's hold on the copy: the agent may replace it once
        no engine holds it. Unmaps the copy unless views of it are still
        alive: those stay valid, and the memory is unmapped when the last
        of them goes. Drop them once loaded, so that the host can free it."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.request({"op": "release"}, 5.0)
            except Error:
                pass  # the agent is gone: nothing to release
            conn.close()
        try:
            self._map.close()
        except BufferError:
            pass  # views alive: unmapped when they are gone

    def __enter__(self) -> "NodeCopy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        conn = self.__dict__.get("_conn")
        if conn is not None:
            conn.close()  # the agent counts a closed session as released

    def __repr__(self) -> str:
        return (f"<tensorhub.node.NodeCopy {self.model}@{self.version} {len(self._tensors)} tensors "
                f"{self.nbytes} bytes from {self.holder}>")


def acquire(model: str, version: Union[int, str] = "latest", *, group: Optional[str] = None,
            step: Optional[int] = None, socket: Optional[str] = None,
            timeout: float = 600.0) -> NodeCopy:
    """The host copy of ``model@version`` from this host's agent.

    The agent fetches it first if it does not hold it (the fetch is shared
    by every engine that asks meanwhile). ``group``/``step``: the reader
    group of an engine's TP ranks, as in ``Client.fetch``: with "latest",
    every rank gets the version the group's first rank resolved.

    Raises:
        NodeUnavailable: fetch it yourself (see module doc).
        NotFoundError, FailedPreconditionError, DeadlineExceededError, ...:
            the agent's fetch failed the way a fetch of your own would.
    """
    name = socket_name(socket)
    msg = _request("acquire", model, version, group, step, timeout)
    conn = _Connection(name, min(timeout, 10.0))
    try:
        # A little beyond the agent's own deadline, so its answer wins.
        reply, fd = conn.request(msg, timeout + 5.0)
        _check(reply, name)
        if fd is None:
            raise NodeUnavailable(f"the node agent at {name} sent no memory with {model}@{reply.get('version')}")
        copy = NodeCopy(conn, reply, fd)
    except BaseException:
        conn.close()
        raise
    logger.debug("node copy %s@%s from %s (%d bytes, fetched now: %s)", copy.model, copy.version,
                 copy.holder, copy.nbytes, copy.fetched_now)
    return copy


def acquire_or_none(model: str, version: Union[int, str] = "latest", *, group: Optional[str] = None,
                    step: Optional[int] = None, socket: Optional[str] = None, timeout: float = 600.0,
                    who: str = "tensorhub") -> Optional[NodeCopy]:
    """The hook the integrations call (vLLM's backend; see the module doc):
    the host copy from this host's agent, or None when the engine should
    fetch the version itself, which is logged at WARNING with the reason
    (never a silent fallback). Other errors raise as :func:`acquire`."""
    try:
        return acquire(model, version, group=group, step=step, socket=socket, timeout=timeout)
    except NodeUnavailable as e:
        logger.warning("%s: no host copy of %s@%s from the node agent (%s); fetching it myself", who, model,
                       version, e.message)
        return None


def stage(model: str, version: Union[int, str] = "latest", *, group: Optional[str] = None,
          step: Optional[int] = None, socket: Optional[str] = None, timeout: float = 600.0) -> int:
    """Asks the agent to start fetching ``model@version`` onto the host, and
    returns at once with the version number it resolved; a later
    :func:`acquire` waits for that fetch. ``timeout`` bounds the agent's
    fetch. Raises as :func:`acquire`."""
    name = socket_name(socket)
    msg = _request("stage", model, version, group, step, timeout)
    conn = _Connection(name, 10.0)
    try:
        reply, fd = conn.request(msg, 60.0)
        if fd is not None:
            os.close(fd)
        return int(_check(reply, name)["version"])
    finally:
        conn.close()


def status(socket: Optional[str] = None, timeout: float = 10.0) -> Dict[str, Any]:
    """What the agent holds: its worker id and data address, the copies
    (model, version, state, bytes, sessions), its counters."""
    name = socket_name(socket)
    conn = _Connection(name, timeout)
    try:
        reply, fd = conn.request({"op": "status"}, timeout)
        if fd is not None:
            os.close(fd)
        return _check(reply, name)
    finally:
        conn.close()


def available(socket: Optional[str] = None) -> bool:
    """Whether an agent answers at the socket now."""
    try:
        status(socket, timeout=2.0)
        return True
    except Error:
        return False


__all__ = ["DEFAULT_SOCKET", "NodeCopy", "NodeUnavailable", "acquire", "acquire_or_none", "available",
           "socket_name", "stage", "status"]
