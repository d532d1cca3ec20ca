"""The TensorHub worker client: publish, unpublish, fetch, and inspect."""

from __future__ import annotations

import operator
import os
import threading
from dataclasses import dataclass, field
from typing import (
    Any,
    Dict,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
    overload,
)

from . import host_memory
from . import _log
from ._native import core as _core
from . import _tensors
from .errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)

#: A version argument: a number >= 1, or "latest" for the highest committed.
VersionArg = Union[int, Literal["latest"]]
#: What publish() and fetch() take: numpy.ndarray or torch.Tensor (CPU).
TensorLike = Any

DEFAULT_HUB = "127.0.0.1:7070"
DEFAULT_CHUNK_BYTES = 4 << 20
_DEFAULT_PUBLISH_TIMEOUT_S = 10.0
_DEFAULT_FETCH_TIMEOUT_S = 120.0

# C++ clients inherited by a forked child: destroying them there would join
# threads that do not exist in the child, so they are never destroyed.
_FORKED_AWAY: List[Any] = []


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a version's manifest."""

    name: str
    dtype: str  #: safetensors spelling: "BF16", "F32", ...
    shape: Tuple[int, ...]
    rank: int  #: which trainer rank's part holds it
    bytes: int

    def numpy_dtype(self) -> Any:
        """The numpy dtype that holds this tensor (InvalidArgumentError for BF16)."""
        return _tensors.numpy_dtype_for(self.dtype)

    def torch_dtype(self) -> Any:
        """The torch dtype that holds this tensor (torch must be imported)."""
        return _tensors.torch_dtype_for(self.dtype)


@dataclass(frozen=True)
class Holder:
    """A worker that holds (all or part of) a version."""

    worker: str
    data_address: str
    labels: Dict[str, str]
    reliable: bool
    chunks: int  #: how many of the version's chunks it holds


@dataclass(frozen=True)
class VersionSummary:
    """One line of :meth:`Client.versions`."""

    model: str
    version: int
    state: str  #: PENDING, COMMITTED, ABORTED or UNAVAILABLE
    holders: int  #: number of live holders
    total_bytes: int
    group_size: int
    parts_published: int
    retained: bool = False  #: pinned by retain() or the hub's keep_latest policy


@dataclass(frozen=True)
class VersionInfo:
    """What :meth:`Client.describe` returns: manifest, holders, metadata."""

    model: str
    version: int
    state: str  #: PENDING, COMMITTED, ABORTED or UNAVAILABLE
    group_size: int
    parts_published: int
    total_bytes: int
    chunk_bytes: int
    num_chunks: int
    tensors: List[TensorInfo] = field(default_factory=list)  #: in layout order
    holders: List[Holder] = field(default_factory=list)
    #: Every part's metadata; on a key given by several ranks the lowest rank wins.
    metadata: Dict[str, Union[str, bytes]] = field(default_factory=dict)
    retained: bool = False  #: pinned by retain() or the hub's keep_latest policy

    @property
    def committed(self) -> bool:
        return self.state == "COMMITTED"

    def empty(self, framework: str = "numpy") -> Dict[str, Any]:
        """Fresh destination buffers for :meth:`Client.fetch` of this version.

        ``framework`` is ``"numpy"`` or ``"torch"``. numpy has no bfloat16: a
        BF16 tensor raises InvalidArgumentError there (use torch). The
        tensors lie in one :class:`tensorhub.HostBuffer` (huge pages where the
        kernel allows them), so that a fetch from a holder on this host, and
        later reads of them from this one, copy at memory speed.
        """
        if framework == "numpy":
            specs = [(t.name, t.shape, t.numpy_dtype()) for t in self.tensors]
        elif framework == "torch":
            specs = [(t.name, t.shape, t.torch_dtype()) for t in self.tensors]
        else:
            raise InvalidArgumentError(f"framework must be 'numpy' or 'torch', not {framework!r}")
        return host_memory.carve(specs, framework)


@dataclass(frozen=True)
class FetchStats:
    """Timing of one fetch (``fetch(..., return_stats=True)``)."""

    version: int
    bytes: int
    seconds: float  #: from resolve to the last verified byte
    resolve_seconds: float  #: the hub round trip
    sources_used: int
    chunk_retries: int
    chunks_stolen: int = 0  #: chunks moved away from a holder that became very slow
    #: data-plane connections opened over TLS (``data_tls``), and of those,
    #: how many the kernel decrypts (kTLS)
    tls_connections: int = 0
    kernel_tls_connections: int = 0
    #: Per holder read from: {"worker", "address", "bytes", "chunks", "was_filling",
    #: "transport", "delta_bytes", "delta_wire_bytes"} (was_filling: it was itself still receiving the version when
    #: chosen; transport: "tcp" or "ucx").
    sources: List[Dict[str, Any]] = field(default_factory=list)
    # The stages of the fetch, one after the other: they add up to
    # total_seconds. The metric tensorhub_fetch_stage_seconds{stage} records
    # the same figures (docs/metrics.md has what each one covers).
    schedule_seconds: float = 0.0  #: destination, filling registration, sources
    first_byte_seconds: float = 0.0  #: until the first chunk is verified
    transfer_seconds: float = 0.0  #: the rest of the data plane, less verify
    verify_seconds: float = 0.0  #: the checksum work's share of the data plane
    register_seconds: float = 0.0  #: reporting the copy to the hub
    total_seconds: float = 0.0  #: the whole call
    bytes_same_host: int = 0  #: of bytes, copied from a holder on this host
    #: The source that served the manifest, when the hub sent only its SHA-256
    #: (the address it was read at, as in ``sources``; "" when the hub sent
    #: it), and the manifest's size. Not counted in ``bytes``.
    manifest_source: str = ""
    manifest_bytes: int = 0
    #: Deltas (docs/design.md, "Deltas on slow links"): the version held
    #: here they were applied to (0: none), the bytes of ``bytes`` rebuilt
    #: from deltas, the delta bytes read for them (indexes included), and the
    #: chunks whose delta did not check out (or whose base was gone) and were
    #: read whole. Per source, ``sources`` has "delta_bytes" and
    #: "delta_wire_bytes".
    delta_base: int = 0
    bytes_from_delta: int = 0
    delta_wire_bytes: int = 0
    delta_chunks_read_whole: int = 0

    #: Stage names, in order (the metric's ``stage`` label values).
    STAGES = ("resolve", "schedule", "first_byte", "transfer", "verify", "register")

    @property
    def stages(self) -> Dict[str, float]:
        """{stage: seconds} for the six stages, in order."""
        return {s: float(getattr(self, f"{s}_seconds")) for s in self.STAGES}

    def bytes_from(self, worker: str) -> int:
        """Bytes this fetch read from the holder whose worker id is ``worker``."""
        return sum(int(s["bytes"]) for s in self.sources if s["worker"] == worker)


@dataclass
class _Held:
    """Python objects whose memory the C++ client serves as model@version."""

    kind: str  # "published" or "fetched"
    objects: List[Any]
    spans: List[Tuple[int, int]]


def _version_number(version: Any, *, allow_latest: bool) -> int:
    if allow_latest and (version is None or version == "latest"):
        return 0
    if isinstance(version, bool):
        raise InvalidArgumentError(f"version must be an integer >= 1, not {version!r}")
    try:
        v = operator.index(version)
    except TypeError:
        extra = ' or "latest"' if allow_latest else ""
        raise InvalidArgumentError(
            f"version must be an integer >= 1{extra}, not {version!r}"
        ) from None
    if v < 1 or v >= 1 << 64:
        raise InvalidArgumentError(f"version must be in [1, 2**64), not {v}")
    return v


def _ms(timeout: Optional[float], default_s: float, what: str) -> int:
    if timeout is None:
        timeout = default_s
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout < 0:
        raise InvalidArgumentError(f"{what} must be a number of seconds >= 0, not {timeout!r}")
    return int(round(float(timeout) * 1000))


def _path(path: Any, what: str) -> str:
    """A file path option (str or os.PathLike) as a string; None: ""."""
    if path is None:
        return ""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"{what} must be a file path, not {path!r}")
    return os.fspath(path)


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{what} must be a bool, not {value!r}")
    return value


def _model(model: Any) -> str:
    if not isinstance(model, str) or not model:
        raise InvalidArgumentError(f"model must be a non-empty string, not {model!r}")
    return model


def _group(group: Optional[str], step: Any) -> Tuple[str, int]:
    if group is None:
        if step:
            raise InvalidArgumentError("step= needs group=")
        return "", 0
    if not isinstance(group, str) or not 0 < len(group) <= 256:
        raise InvalidArgumentError(f"group must be a string of 1-256 characters, not {group!r}")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2**64:
        raise InvalidArgumentError(f"step must be an integer in [0, 2**64), not {step!r}")
    return group, step


def _version_info(d: Dict[str, Any]) -> VersionInfo:
    metadata: Dict[str, Union[str, bytes]] = {}
    for k, v in d["metadata"]:
        metadata.setdefault(k, v)
    return VersionInfo(
        model=d["model"],
        version=d["version"],
        state=d["state"],
        group_size=d["group_size"],
        parts_published=d["parts_published"],
        total_bytes=d["total_bytes"],
        chunk_bytes=d["chunk_bytes"],
        num_chunks=d["num_chunks"],
        tensors=[
            TensorInfo(t["name"], t["dtype"], tuple(t["shape"]), t["rank"], t["bytes"])
            for t in d["tensors"]
        ],
        holders=[
            Holder(h["worker"], h["data_address"], dict(h["labels"]), h["reliable"], h["chunks"])
            for h in d["holders"]
        ],
        metadata=metadata,
        retained=bool(d["retained"]),
    )


class Client:
    """One TensorHub worker. Create it with :func:`tensorhub.connect`.

    A client registers with the hub, keeps its lease alive, and serves reads
    of the versions it holds straight from the caller's memory. Methods may
    be called from several threads; each releases the GIL while it waits.

    Memory contract: arrays passed to :meth:`publish`, and arrays filled by
    :meth:`fetch` with ``serve=True``, are read by other workers until
    :meth:`unpublish` of that version returns (or the client is closed). Do
    not modify them before then. The client keeps a reference to each of
    those arrays, so dropping your own references cannot free memory that is
    still served.

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, core: Any, options: Dict[str, Any]) -> None:
        # Use tensorhub.connect(); this constructor is not public API.
        self._core = core
        self._options = options
        self._pid = os.getpid()
        self._lock = threading.Lock()
        # (model, version) -> held objects; guarded by _lock.
        self._held: Dict[Tuple[str, int], List[_Held]] = {}

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Leaves the hub and stops serving; idempotent.

        If this worker holds the last reliable copy of a retained version,
        leaving first waits (``leave_timeout``, still serving) for a keeper
        to copy it. Reads in flight from this worker then fail over to other
        holders. For a graceful exit, :meth:`unpublish` first. Held references are dropped
        only after the C++ client is gone, so no memory is freed while it
        could still be read.
        """
        core = self.__dict__.get("_core")
        if core is None:
            return
        if os.getpid() != self._pid:
            # A forked child: the C++ client's threads live in the parent.
            _FORKED_AWAY.append(core)
        else:
            core.close()
        with self._lock:
            self._held.clear()

    @property
    def closed(self) -> bool:
        return self._core.closed

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        if self._core.closed:
            return "<tensorhub.Client closed>"
        return (
            f"<tensorhub.Client {self._core.id} hub={self._options['hub']} "
            f"data={self._core.data_address}>"
        )

    def __getstate__(self) -> Any:
        raise TypeError(
            "a tensorhub.Client cannot be pickled or sent to another process; "
            "call tensorhub.connect() in that process"
        )

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise FailedPreconditionError(
                "this client was created in another process (fork); call "
                "tensorhub.connect() in this process",
                9,
            )

    @property
    def worker_id(self) -> str:
        """The hub-assigned id of this worker."""
        return self._core.id

    @property
    def data_address(self) -> str:
        """HOST:PORT where this worker serves reads."""
        return self._core.data_address

    @property
    def metrics_address(self) -> Optional[str]:
        """HOST:PORT of this worker's Prometheus endpoint (GET /metrics), or
        None without ``connect(..., metrics_listen=...)``."""
        return self._core.metrics_address or None

    @property
    def hub(self) -> str:
        return self._options["hub"]

    # -- publish / unpublish ----------------------------------------------

    def publish(
        self,
        model: str,
        version: int,
        tensors: Mapping[str, TensorLike],
        rank: int = 0,
        group_size: int = 1,
        chunk_bytes: Optional[int] = None,
        timeout: Optional[float] = None,
        *,
        metadata: Optional[Mapping[str, str]] = None,
        dtypes: Optional[Mapping[str, str]] = None,
        pieces: Optional[Mapping[str, Tuple[Sequence[int], Sequence[int]]]] = None,
        segment_bytes: int = 64 << 10,
        chunk_checksum: Optional[str] = None,
    ) -> None:
        """Registers references to ``tensors`` as rank ``rank`` of ``model@version``.

        ``pieces`` publishes shards: ``{name: (global_shape, offset)}`` says
        that ``tensors[name]`` is the box at ``offset`` of a logical tensor of
        ``global_shape`` (see :mod:`tensorhub.reshard`: ``fsdp_shards``,
        ``tp_shards``). The ranks' boxes must tile every tensor; the hub
        refuses the last rank's publish otherwise. ``segment_bytes`` sets
        the segment checksums readers of slices verify with (0: none).

        No copy is made: other workers read the arrays' memory directly until
        :meth:`unpublish`. The client holds a reference to every array until
        then. The version becomes readable once all ``group_size`` ranks
        published it. Version numbers must increase per model.

        Args:
            model: model name.
            version: an integer >= 1, greater than any earlier version.
            tensors: names -> C-contiguous CPU numpy arrays or torch tensors.
            rank, group_size: this worker's part of a model-parallel group.
            chunk_bytes: transfer unit (default 4 MiB).
            timeout: seconds for the hub round trip (default 10).
            metadata: free-form string pairs stored with this part.
            dtypes: names -> dtype name ("BF16", ...) to publish an array's
                bytes as another dtype of the same element size, e.g. a numpy
                uint16 array holding bfloat16 bits.
            chunk_checksum: "xxh3-64-tree-64k" (the default, verified on a
                GPU in parallel) or "xxh3-64", which readers of TensorHub
                builds before 2026-11-25 can verify; None: the environment's
                TENSORHUB_CHUNK_CHECKSUM, else the tree.

        Raises:
            InvalidArgumentError: non-contiguous, non-CPU or unsupported
                tensors, bad version or rank, an unknown chunk_checksum,
                pieces that do not fit their global shape; also a part the
                hub finds inconsistent with the other ranks' (sizes, dtypes,
                pieces that overlap or, with the last rank, do not tile).
            FailedPreconditionError: version not greater than the last, or
                the memory is still published under another version.
            AlreadyExistsError: this rank of the version is published
                already (by another worker).
            AbortedError: the version was aborted (a rank left before the
                group completed it).
            ResourceExhaustedError: the hub's bounds (models, versions,
                metadata) are reached.
            PermissionDeniedError: the hub refused the shared secret.
            UnavailableError, DeadlineExceededError: hub unreachable.
            Nothing stays published after an error.
        """
        self._check_process()
        model = _model(model)
        v = _version_number(version, allow_latest=False)
        tuples = _tensors.to_tuples(tensors, writable=False, dtypes=dtypes)
        md = [(str(k), str(val)) for k, val in (metadata or {}).items()]
        if rank < 0 or group_size < 1:
            raise InvalidArgumentError(f"rank {rank} is not in a group of {group_size}")
        cb = DEFAULT_CHUNK_BYTES if chunk_bytes is None else int(chunk_bytes)
        if cb <= 0:
            raise InvalidArgumentError(f"chunk_bytes must be > 0, not {chunk_bytes}")
        objs = list(tensors.values())
        # CUDA tensors: the bytes the caller's stream is still writing must
        # be there before the checksums are taken and readers read them.
        _tensors.sync_cuda_streams(tensors)
        # Hold the references before the C++ side can serve the memory.
        held = _Held("published", objs, _tensors.spans(tuples))
        with self._lock:
            self._held.setdefault((model, v), []).append(held)
        po = _core.PublishOptions()
        po.rank = int(rank)
        po.group_size = int(group_size)
        po.chunk_bytes = cb
        po.timeout_ms = _ms(timeout, _DEFAULT_PUBLISH_TIMEOUT_S, "timeout")
        po.metadata = md
        po.pieces = {str(k): ([int(x) for x in g], [int(x) for x in o])
                     for k, (g, o) in (pieces or {}).items()}
        po.segment_bytes = int(segment_bytes)
        po.chunk_checksum = "" if chunk_checksum is None else str(chunk_checksum)
        try:
            self._core.publish(model, v, tuples, po)
        except BaseException:
            # Publish withdraws its local registration on failure.
            self._drop(model, v, held)
            raise

    def unpublish(
        self, model: str, version: int, timeout: Optional[float] = 30.0, *, force: bool = False
    ) -> None:
        """Withdraws this worker's reference to ``model@version`` and drains.

        Returns once reads in flight from this worker's memory have finished;
        afterwards the arrays may be modified or freed, and the client drops
        its references to them. Works for published versions and for
        versions this worker holds because it fetched them with ``serve=True``.

        Retained versions: if this worker holds the last reliable copy, the
        call first waits (still serving, within ``timeout``) until a keeper
        (``tensorhub keeper``) or another reliable worker has copied it.

        Raises:
            NotFoundError: this worker does not hold that version.
            FailedPreconditionError: the version is retained, this is its last
                reliable copy, and nobody copied it within ``timeout``; it is
                still published. ``force=True`` drops it anyway.
            DeadlineExceededError: reads were still running after ``timeout``
                seconds (new reads are refused all the same; the client keeps
                its references, since the memory may still be read).
        """
        self._check_process()
        model = _model(model)
        v = _version_number(version, allow_latest=False)
        try:
            self._core.unpublish(model, v, _ms(timeout, 30.0, "timeout"), bool(force))
        except DeadlineExceededError:
            raise
        except NotFoundError:
            # Nothing is registered: nothing can read the memory.
            self._drop(model, v)
            raise
        self._drop(model, v)

    def _fetch_options(self, timeout: Optional[float], connections: Any,
                       group: Optional[str], step: Any) -> Any:
        if not isinstance(connections, int) or connections < 1:
            raise InvalidArgumentError(f"connections must be an integer >= 1, not {connections!r}")
        fo = _core.FetchOptions()
        fo.timeout_ms = _ms(timeout, _DEFAULT_FETCH_TIMEOUT_S, "timeout")
        fo.connections = connections
        fo.group, fo.group_step = _group(group, step)
        return fo

    def fetch_slices(
        self,
        model: str,
        version: VersionArg = "latest",
        slices: Optional[Mapping[str, Tuple[Any, ...]]] = None,
        timeout: Optional[float] = None,
        connections: int = 4,
        *,
        return_stats: bool = False,
        group: Optional[str] = None,
        step: int = 0,
        serve_slices: bool = False,
    ) -> Union[int, FetchStats]:
        """Pulls boxes of ``model@version``'s logical tensors, whatever the
        trainer ranks' layout, and returns the version.

        ``slices`` maps a logical tensor's name to ``(tensor, box)`` or
        ``(tensor, box, fp8_scales)``: ``tensor`` (a writable, C-contiguous
        CPU numpy array or torch tensor of the box's shape) receives the box
        ``(offset, extent)`` of that tensor (see
        :func:`tensorhub.reshard.tp_slices`), converted to the tensor's own
        dtype (BF16/F16/F32 to each other; F8_E4M3 needs the scales: one,
        or one per row of the box, see :func:`tensorhub.reshard.fp8_scale`).
        Only the segments the boxes touch are read, and each is verified.
        ``fetch(into={name: (tensor, box)})`` is the same call.

        With ``serve_slices=True`` the slices kept in the version's dtype are
        then served onward (a holder of slices; docs/design.md): the client
        holds the tensors until :meth:`unpublish` of the version, as
        ``serve=True`` does for a full fetch. Do not modify them meanwhile.

        Raises:
            InvalidArgumentError: an unknown tensor, a box outside it, a
                tensor whose shape is not its box's, a dtype that cannot be
                converted, F8 without scales (nothing is fetched).
            FailedPreconditionError: the version was published without
                segment checksums (or from device memory): fetch it whole;
                or it is not committed.
            NotFoundError: unknown model or version.
            DataLossError: every holder served bytes that failed their
                checksum.
            UnavailableError: no live holder (or the hub is unreachable).
            DeadlineExceededError: ``timeout`` passed with bytes still
                arriving.
        """
        self._check_process()
        model = _model(model)
        v = _version_number(version, allow_latest=True)
        if not slices:
            raise InvalidArgumentError(
                "fetch_slices needs slices= ({name: (tensor, box)} or "
                "{name: (tensor, box, fp8_scales)})")
        fo = self._fetch_options(timeout, connections, group, step)
        fo.serve_slices = bool(serve_slices)
        tensors, boxes, scales = {}, [], []
        for name, entry in slices.items():
            if not isinstance(entry, tuple) or len(entry) not in (2, 3):
                raise InvalidArgumentError(
                    f"slices[{name!r}] must be (tensor, box) or (tensor, box, fp8_scales)")
            tensors[name] = entry[0]
            off, ext = entry[1]
            boxes.append(([int(x) for x in off], [int(x) for x in ext]))
            scales.append([float(x) for x in entry[2]] if len(entry) == 3 else [])
        tuples = _tensors.to_tuples(tensors, writable=True, dtypes=None)
        spans = _tensors.spans(tuples)
        stats = self._core.fetch_slices(
            model, v, list(zip(tuples, boxes, scales)), fo)
        return self._fetched(model, stats, spans, list(tensors.values()),
                             bool(serve_slices), return_stats)

    def _fetched(self, model: str, stats: dict, spans, objs: list, serve: bool,
                 return_stats: bool):
        """What a fetch (whole or slices) returns, after the bookkeeping of
        what this client serves: the C++ client withdrew every registration
        overlapping the destination before writing to it, so those objects
        are no longer served; the destination is, if `serve`."""
        got = int(stats["version"])
        with self._lock:
            for key in list(self._held):
                kept = [e for e in self._held[key] if not _tensors.overlaps(e.spans, spans)]
                if kept:
                    self._held[key] = kept
                else:
                    del self._held[key]
            if serve:
                self._held.setdefault((model, got), []).append(_Held("fetched", objs, spans))
        if not return_stats:
            return got
        return FetchStats(
            version=got,
            bytes=int(stats["bytes"]),
            seconds=float(stats["seconds"]),
            resolve_seconds=float(stats["resolve_seconds"]),
            sources_used=int(stats["sources_used"]),
            chunk_retries=int(stats["chunk_retries"]),
            chunks_stolen=int(stats["chunks_stolen"]),
            tls_connections=int(stats["tls_connections"]),
            kernel_tls_connections=int(stats["kernel_tls_connections"]),
            sources=[dict(s) for s in stats.get("sources", [])],
            schedule_seconds=float(stats["schedule_seconds"]),
            first_byte_seconds=float(stats["first_byte_seconds"]),
            transfer_seconds=float(stats["transfer_seconds"]),
            verify_seconds=float(stats["verify_seconds"]),
            register_seconds=float(stats["register_seconds"]),
            total_seconds=float(stats["total_seconds"]),
            bytes_same_host=int(stats["bytes_same_host"]),
            manifest_source=str(stats.get("manifest_source", "")),
            manifest_bytes=int(stats.get("manifest_bytes", 0)),
            delta_base=int(stats.get("delta_base", 0)),
            bytes_from_delta=int(stats.get("bytes_from_delta", 0)),
            delta_wire_bytes=int(stats.get("delta_wire_bytes", 0)),
            delta_chunks_read_whole=int(stats.get("delta_chunks_read_whole", 0)),
        )

    def _drop(self, model: str, version: int, only: Optional[_Held] = None) -> None:
        with self._lock:
            entries = self._held.get((model, version))
            if entries is None:
                return
            if only is None:
                del self._held[(model, version)]
            else:
                entries[:] = [e for e in entries if e is not only]
                if not entries:
                    del self._held[(model, version)]

    # -- fetch ---------------------------------------------------------------

    @overload
    def fetch(
        self,
        model: str,
        version: VersionArg = ...,
        into: Optional[Mapping[str, TensorLike]] = ...,
        timeout: Optional[float] = ...,
        connections: int = ...,
        serve: bool = ...,
        *,
        allow_bitcast: bool = ...,
        return_stats: Literal[False] = ...,
        group: Optional[str] = ...,
        step: int = ...,
        serve_slices: bool = ...,
    ) -> int: ...

    @overload
    def fetch(
        self,
        model: str,
        version: VersionArg = ...,
        into: Optional[Mapping[str, TensorLike]] = ...,
        timeout: Optional[float] = ...,
        connections: int = ...,
        serve: bool = ...,
        *,
        allow_bitcast: bool = ...,
        return_stats: Literal[True],
        group: Optional[str] = ...,
        step: int = ...,
        serve_slices: bool = ...,
    ) -> FetchStats: ...

    def fetch(
        self,
        model: str,
        version: VersionArg = "latest",
        into: Optional[Mapping[str, TensorLike]] = None,
        timeout: Optional[float] = None,
        connections: int = 4,
        serve: bool = True,
        *,
        allow_bitcast: bool = False,
        return_stats: bool = False,
        group: Optional[str] = None,
        step: int = 0,
        serve_slices: bool = False,
    ) -> Union[int, FetchStats]:
        """Pulls ``model@version`` into ``into``, in place, and returns the version.

        ``into`` must name exactly the version's tensors, each a writable,
        C-contiguous CPU numpy array or torch tensor of the same dtype and
        shape (see :meth:`VersionInfo.empty` to allocate them). Bytes come
        from any holders, are checksummed, and failed chunks are retried on
        other holders. After a failed fetch the contents of ``into`` are
        unspecified.

        With ``serve=True`` (default) this worker then serves the version
        from ``into`` to other readers, and the client holds references to
        those arrays until :meth:`unpublish` of that version, until a later
        fetch into the same memory (which first withdraws the old version,
        waiting for its reads), or until :meth:`close`. Do not modify them
        meanwhile. A version several trainer ranks published as pieces is
        served so too, once fetched, as a holder of slices of the whole
        tensors (docs/design.md, "Resharding").

        Args:
            version: an integer, or "latest" for the highest committed one.
            timeout: seconds for the whole fetch (default 120).
            connections: parallel data streams.
            allow_bitcast: fill arrays whose dtype differs from the version's
                but has the same element size (e.g. numpy uint16 from BF16)
                with the raw bytes. Costs one extra hub round trip.
            return_stats: return a :class:`FetchStats` instead of the version.
            group, step: reader group (the ranks of one model-parallel
                inference instance). With "latest", every call naming the
                same ``group`` and ``step`` gets the version the group's
                first call resolved, even if a newer one has committed since.
                All ranks pass the same id and step for the same update.

        ``into={name: (tensor, box)}`` (every value a tuple) fetches boxes
        of the logical tensors instead: :meth:`fetch_slices`.

        Raises:
            InvalidArgumentError: names, dtypes or shapes do not match, or
                arrays are non-contiguous, read-only, or overlap.
            NotFoundError: unknown model or version.
            FailedPreconditionError: the version is not committed.
            DataLossError: every holder served bytes that failed their
                checksum (asking again will not help).
            UnavailableError: no live holder (or the hub is unreachable).
            DeadlineExceededError: ``timeout`` passed with bytes still
                arriving.
            AbortedError: the version was aborted while it was fetched.
            PermissionDeniedError: the hub or a holder refused the shared
                secret or this worker's certificate.
            After an error nothing of ``into`` is served.
        """
        self._check_process()
        model = _model(model)
        v = _version_number(version, allow_latest=True)
        if into is None:
            raise InvalidArgumentError(
                "fetch needs into= (names -> arrays to fill); allocate them with "
                "client.describe(model, version).empty()"
            )
        if into and all(isinstance(x, tuple) for x in into.values()):
            # The slice form: fetch_slices, named explicitly there.
            return self.fetch_slices(model, version, into, timeout, connections,
                                     return_stats=return_stats, group=group,
                                     step=step, serve_slices=serve_slices)
        fo = self._fetch_options(timeout, connections, group, step)
        fo.serve = bool(serve)
        dtypes = None
        if allow_bitcast:
            info = self.describe(model, "latest" if v == 0 else v, group=group, step=step)
            v = info.version  # fetch what was described, even if "latest" moves
            dtypes = {t.name: t.dtype for t in info.tensors if t.name in into}
        tuples = _tensors.to_tuples(into, writable=True, dtypes=dtypes)
        spans = _tensors.spans(tuples)
        # CUDA tensors: work queued on the caller's stream that still reads
        # or writes them must finish before the fetch overwrites them.
        _tensors.sync_cuda_streams(into)
        stats = self._core.fetch(model, v, tuples, fo)
        return self._fetched(model, stats, spans, list(into.values()), bool(serve),
                             return_stats)

    # -- inspection ------------------------------------------------------------

    def models(self) -> List[str]:
        """Names of the models the hub knows."""
        self._check_process()
        return [m["model"] for m in self._core.list()]

    def versions(self, model: str) -> List[VersionSummary]:
        """Versions of ``model`` the hub knows, oldest first ([] if none)."""
        self._check_process()
        model = _model(model)
        out: List[VersionSummary] = []
        for m in self._core.list():
            if m["model"] != model:
                continue
            for d in m["versions"]:
                out.append(
                    VersionSummary(
                        model=model,
                        version=d["version"],
                        state=d["state"],
                        holders=d["num_holders"],
                        total_bytes=d["total_bytes"],
                        group_size=d["group_size"],
                        parts_published=d["parts_published"],
                        retained=bool(d["retained"]),
                    )
                )
        return out

    def describe(
        self,
        model: str,
        version: VersionArg = "latest",
        *,
        group: Optional[str] = None,
        step: int = 0,
    ) -> VersionInfo:
        """Manifest, holders, metadata and state of one version.

        Uncommitted versions are described too (see ``.state``). With a
        reader ``group`` (see :meth:`fetch`), "latest" is the group's version
        for ``step`` (pinned now if this is the group's first call for it).

        Raises:
            NotFoundError: unknown model or version (or no committed version
                for "latest").
        """
        self._check_process()
        model = _model(model)
        v = _version_number(version, allow_latest=True)
        group_id, step = _group(group, step)
        return _version_info(self._core.describe(model, v, group_id, step))

    # -- retention -------------------------------------------------------------

    def retain(self, model: str, version: int) -> None:
        """Pins ``model@version`` (pending or committed) as retained.

        A retained version stays fetchable while one reliable copy lives:
        its last reliable holder cannot unpublish or leave before a keeper
        (``tensorhub keeper``) has copied it. It is lost only if that copy
        dies (then UNAVAILABLE). Pins live in the hub: after a hub restart,
        keepers pin the versions they hold again; pin others again.

        Raises:
            NotFoundError: unknown version.
            FailedPreconditionError: the version is aborted or unavailable.
        """
        self._check_process()
        self._core.retain(_model(model), _version_number(version, allow_latest=False), True)

    def unretain(self, model: str, version: int) -> None:
        """Withdraws a :meth:`retain` pin (NotFoundError if there is none)."""
        self._check_process()
        self._core.retain(_model(model), _version_number(version, allow_latest=False), False)

    def held(self) -> Dict[Tuple[str, int], int]:
        """(model, version) -> number of arrays the client keeps alive for it."""
        with self._lock:
            return {k: sum(len(e.objects) for e in es) for k, es in self._held.items()}


_LABEL_KEYS = ("datacenter", "rack", "host")
# Options of connect() beyond the worker settings of tensorhub.config (which
# connect() also takes, each defaulting to its environment variable).
_OPTION_DEFAULTS: Dict[str, Any] = {
    "rpc_timeout": 5.0,
    "connect_timeout": 10.0,
    "heartbeat_interval": None,
    "max_serving_connections": 256,
    "secret": None,
    "leave_timeout": 10.0,
    "deltas": None,
}
# connect(deltas={...}): the keys of ClientOptions::deltas
# (tensorhub/client.h, DeltaOptions), "wait" in seconds.
_DELTA_KEYS = ("serve", "read", "datacenter_link_bytes_per_s", "wide_area_link_bytes_per_s",
               "apply_bytes_per_s", "max_memory_bytes", "wait")


def _deltas(value: Any, into: Any) -> None:
    """Fills the core's DeltaOptions `into` from connect()'s ``deltas``."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"deltas must be a dict with keys {list(_DELTA_KEYS)}, not {value!r}")
    bad = set(value) - set(_DELTA_KEYS)
    if bad:
        raise InvalidArgumentError(f"unknown deltas keys {sorted(bad)}; use {list(_DELTA_KEYS)}")
    for k in ("serve", "read"):
        if k in value:
            setattr(into, k, _flag(value[k], f"deltas[{k!r}]"))
    for k in ("datacenter_link_bytes_per_s", "wide_area_link_bytes_per_s", "apply_bytes_per_s"):
        if k in value:
            v = value[k]
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise InvalidArgumentError(f"deltas[{k!r}] must be a number of bytes per second > 0, not {v!r}")
            setattr(into, k, float(v))
    if "max_memory_bytes" in value:
        v = value["max_memory_bytes"]
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InvalidArgumentError(f"deltas['max_memory_bytes'] must be an int >= 0, not {v!r}")
        into.max_memory_bytes = v
    if "wait" in value:
        into.wait_ms = _ms(value["wait"], 5.0, "deltas['wait']")


_SETTINGS = ("data_listen", "advertise_host", "metrics_listen", "tls_ca", "tls_cert", "tls_key",
             "tls_server_name", "data_tls", "insecure", "secret_file", "datacenter", "rack",
             "host_label")


def _metrics_listen(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"metrics_listen must be 'HOST:PORT' or None, not {value!r}")
    return value


def connect(
    hub: Optional[str] = None,
    worker_id: Optional[str] = None,
    labels: Optional[Mapping[str, str]] = None,
    reliable: bool = True,
    **options: Any,
) -> Client:
    """Registers a worker with the hub at ``hub`` and returns its :class:`Client`.

    Args:
        hub: HOST:PORT of the hub, or the comma-separated addresses of a
            highly available hub set (calls follow its leader); default
            ``$TENSORHUB_HUB`` or 127.0.0.1:7070.
        worker_id: a human-readable worker name for logs and listings
            (default host:pid); the hub assigns the actual id
            (:attr:`Client.worker_id`).
        labels: where this worker runs, ``{"datacenter": .., "rack": ..,
            "host": ..}``; readers prefer near holders.
        reliable: False marks a spot worker (may vanish; retention does not
            rely on it).
        **options: ``rpc_timeout`` (5 s), ``connect_timeout`` (10 s),
            ``heartbeat_interval`` (None: a third of the hub's lease, at
            most 5 s), ``max_serving_connections`` (256),
            ``secret`` (the shared secret itself; default: the file of
            ``secret_file``, else ``$TENSORHUB_SECRET``),
            ``leave_timeout`` (10 s: on close, how long to wait, still
            serving, for a keeper to copy retained versions only this worker
            holds), and the worker settings of :mod:`tensorhub.config`, each
            defaulting to its environment variable: ``secret_file``,
            ``data_listen`` (default: 127.0.0.1:0 when the hub is on
            loopback, else the address of the interface that routes to the
            hub, port 0), ``advertise_host``, ``metrics_listen`` (HOST:PORT:
            serve this worker's Prometheus metrics at ``/metrics``, port 0
            for a free one, see :attr:`Client.metrics_address`; default
            None: no endpoint), ``datacenter``, ``rack``, ``host_label``
            (the labels, as ``labels`` gives them). TLS (PEM file paths, see
            docs/security.md): ``tls_ca`` (talk TLS to the hub, trusting a
            hub certificate signed by this CA), ``tls_cert`` and
            ``tls_key`` (this worker's certificate, for a hub that requires
            client certificates and for data-plane TLS),
            ``tls_server_name`` (the name the hub's certificate must have,
            default the host in ``hub``), ``data_tls`` (False: TLS on
            data-plane connections too; every worker must agree),
            ``insecure`` (False: accept a non-loopback ``data_listen`` with
            neither a secret nor ``data_tls``, on a private test network;
            without it such a worker is refused).
            ``deltas`` (None: the defaults of DeltaOptions in
            tensorhub/client.h, deltas served and read): a dict with any of
            ``serve`` and ``read`` (bools), ``datacenter_link_bytes_per_s``
            and ``wide_area_link_bytes_per_s`` (the links the delta/full
            choice assumes, default 10 Gbit/s and 1 Gbit/s),
            ``apply_bytes_per_s`` (1e9), ``max_memory_bytes`` (the deltas
            this worker keeps to serve, 1 GiB) and ``wait`` (seconds a
            reader behind a slow link waits for a delta being computed, 5);
            see docs/design.md, "Deltas on slow links".

    Raises:
        UnavailableError, DeadlineExceededError: the hub did not answer
            within ``connect_timeout``.
        PermissionDeniedError: wrong secret, or a TLS certificate missing
            or not trusted (by either end).
        FailedPreconditionError: one end uses TLS and the other does not
            (the message says what to set).
        InvalidArgumentError: a TLS file missing, unreadable or not
            matching.
        FailedPreconditionError: also a non-loopback ``data_listen`` with
            neither a secret nor ``data_tls``, without ``insecure=True``.
    """
    unknown = set(options) - set(_OPTION_DEFAULTS) - set(_SETTINGS)
    if unknown:
        raise TypeError(
            f"connect() got unknown options {sorted(unknown)}; known: "
            f"{sorted(set(_OPTION_DEFAULTS) | set(_SETTINGS))}"
        )
    opts = dict(_OPTION_DEFAULTS, **{k: v for k, v in options.items() if k in _OPTION_DEFAULTS})
    lab = dict(labels or {})
    bad = set(lab) - set(_LABEL_KEYS)
    if bad:
        raise InvalidArgumentError(f"unknown label keys {sorted(bad)}; use {list(_LABEL_KEYS)}")
    from . import config

    for k in ("tls_ca", "tls_cert", "tls_key"):
        _path(options.get(k), k)  # a bad type is named before anything else
    for k in ("data_tls", "insecure"):
        if k in options and options[k] is not None:
            _flag(options[k], k)
    _metrics_listen(options.get("metrics_listen"))
    s = config.worker_settings(
        {"hub": hub, "labels": lab, **{k: options.get(k) for k in _SETTINGS}},
        what="connect()", secret=opts["secret"],
    )
    _log.sync_level()
    try:
        core = _connect_core(s, worker_id, reliable, opts)
    except FailedPreconditionError as e:
        if s.data_listen_source != "route to the hub":
            raise
        raise FailedPreconditionError(
            f"{e.message} (this worker listens on {s.data_listen}, the interface that routes to the hub "
            f"{s.hub}, because no data_listen was given: set the deployment's secret "
            f"(secret_file, $TENSORHUB_SECRET_FILE or $TENSORHUB_SECRET) or data_tls, or "
            f"data_listen='127.0.0.1:0' for a worker no other host reads from)", e.code
        ) from None
    opts.update(s.connect_kwargs())
    return Client(core, {"worker_id": worker_id, **opts})


def _connect_core(s: Any, worker_id: Optional[str], reliable: bool, opts: Dict[str, Any]) -> Any:
    o = _core.ClientOptions()
    o.hub_address = s.hub
    o.name = worker_id or ""
    o.datacenter = str(s.labels.get("datacenter", ""))
    o.rack = str(s.labels.get("rack", ""))
    o.host = str(s.labels.get("host", ""))
    o.reliable = bool(reliable)
    o.data_listen_address = s.data_listen
    o.data_advertise_host = s.advertise_host
    o.rpc_timeout_ms = _ms(opts["rpc_timeout"], 5.0, "rpc_timeout")
    o.connect_timeout_ms = _ms(opts["connect_timeout"], 10.0, "connect_timeout")
    o.heartbeat_interval_ms = _ms(opts["heartbeat_interval"], 0.0, "heartbeat_interval")
    o.max_serving_connections = int(opts["max_serving_connections"])
    o.secret = s.secret
    o.leave_timeout_ms = _ms(opts["leave_timeout"], 10.0, "leave_timeout")
    o.metrics_listen = s.metrics_listen
    o.tls_ca_file = s.tls_ca
    o.tls_cert_file = s.tls_cert
    o.tls_key_file = s.tls_key
    o.tls_server_name = s.tls_server_name
    o.data_tls = s.data_tls
    o.insecure = s.insecure
    _deltas(opts["deltas"], o.deltas)
    return _core.Client.connect(o)
