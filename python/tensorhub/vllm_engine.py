"""The vLLM weight-transfer engines of the ``"tensorhub"`` backend.

This module imports vLLM and torch; vLLM imports it lazily once an engine is
created (see :func:`tensorhub.vllm.register`).

Worker side, :class:`TensorHubWeightTransferEngine`, one per vLLM worker (TP
rank). An update is ``start_weight_update`` / ``update_weights`` /
``finish_weight_update``; ``update_weights`` does all the work:

1. fetch ``model@version`` from TensorHub into fresh host buffers, by the
   tensors' Hugging Face names (or take a version staged earlier). Nothing in
   the model is touched until every byte arrived and was verified, so a
   failed fetch (unknown version, hub down, deadline) leaves the engine
   serving its old weights;
2. apply: ``initialize_layerwise_reload(model)``, ``model.load_weights(...)``,
   ``finalize_layerwise_reload(model, model_config)``, as vLLM's own
   checkpoint-format engines do (the CPU worker prepacks linear weights, so a
   plain ``load_weights`` would fail);
3. keep the fetched buffers and serve them to other workers (readers pull
   from this engine, not only from the trainer) until the next version
   replaces them, then withdraw the old one (in a background thread, after
   the update returned: the unpublish waits for the old version's reads).

Prefetch: ``update_weights({"model": M, "version": V, "stage": True})``
starts the fetch in a background thread and returns at once; the engine
keeps generating. A later ``update_weights({"model": M, "version": V})``
waits for that fetch and only applies, so the pause covers the apply.
``stats()`` (and :func:`tensorhub.vllm.worker_stats`) report both parts:
``stage_seconds`` with ``stage_started_at`` / ``stage_finished_at`` (this
process's ``time.monotonic()``, to line up with what the engine did
meanwhile), and ``wait_seconds`` + ``apply_seconds`` in the pause.

The TP ranks of one engine form a TensorHub reader group: with
``"version": "latest"`` every rank loads the version the group's first rank
resolved, even if a newer one commits meanwhile.

Tensor parallelism: a rank fetches only what its loaders read. The first
update loads whole tensors under :class:`tensorhub.read_trace.ReadTrace`,
which records the box of every tensor that vLLM's own weight loaders read
(their ``narrow``, expert selection, skipped tied heads); later updates
fetch exactly those boxes, and are traced too: a read outside a fetched box
makes the engine fetch the whole tensors and load again, so no byte a loader
reads is ever left unfetched.

Draft models (speculative decoding): vLLM retargets the engine with
``set_weight_update_target`` for ``start_draft_weight_update``; the engine
holds and serves the draft's version apart from the target model's.
LoRA: vLLM's worker resets its LoRA state after ``finish_weight_update``,
as for its own backends; adapters are not moved by this backend.
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import torch
from functools import cached_property

from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.logger import init_logger

from . import config as th_config
from .client import Client, FetchStats, connect
from .errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)
from .pieces import LocalShare, local_share, meta_share
from .torch import ALIASES_KEY

logger = init_logger(__name__)

_LIVE: "weakref.WeakSet[TensorHubWeightTransferEngine]" = weakref.WeakSet()


def live_engine_stats() -> List[Dict[str, Any]]:
    """The last update's timings of every live engine in this process."""
    return [e.stats() for e in list(_LIVE)]


def _check_version(version: Any, what: str) -> Union[int, str]:
    if version == "latest":
        return "latest"
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{what}: version must be an integer >= 1 or \"latest\", not {version!r}")
    return version


# -- worker side -----------------------------------------------------------


# The worker settings (tensorhub.config) an init_info may carry, by the names
# the CLI, connect() and every integration share.
_SETTING_FIELDS = ("secret_file", "data_listen", "advertise_host", "metrics_listen", "tls_ca",
                   "tls_cert", "tls_key", "tls_server_name", "data_tls", "insecure",
                   "datacenter", "rack", "host_label", "labels")


@dataclass
class TensorHubInitInfo(WeightTransferInitInfo):
    """``init_info`` of the tensorhub backend (a JSON object over HTTP).

    Attributes:
        hub: HOST:PORT of the TensorHub hub (an HA set: comma-separated);
            default ``$TENSORHUB_HUB``.
        secret_file, data_listen, advertise_host, metrics_listen, tls_ca,
            tls_cert, tls_key, tls_server_name, data_tls, insecure,
            datacenter, rack, host_label (or ``labels``): the worker
            settings of :mod:`tensorhub.config`, each defaulting to its
            ``TENSORHUB_*`` environment variable as seen by the vLLM
            worker. Without ``data_listen``, an engine whose hub is on
            another host serves on the address of its interface that routes
            to the hub (and then needs the secret or data TLS).
        reader_group: id shared by the TP ranks of this engine (default:
            derived from vLLM's instance id, which all its workers share).
        timeout_s: default deadline of one fetch, in seconds (waiting for
            the version to commit included).
        connections: parallel data streams per fetch.
        worker_name: name in the hub's listings (default vllm-GROUP-rankN).
        slices: fetch only what this TP rank's loaders read (learned from
            the first, whole load; see the module doc) and serve those
            slices onward to the same rank of other engines. Default: when
            tensor_parallel_size > 1. True at TP 1 takes the same path
            (whole boxes; what the tests run on a CPU vLLM).
        node: the socket of this host's node agent (``tensorhub node``;
            ``"@tensorhub-node"`` or a path; default ``$TENSORHUB_NODE``,
            else none): updates load straight from the host's one copy
            (tensorhub.node), and fetch for themselves, saying so, when the
            agent does not answer.
    """

    hub: Optional[str] = None
    secret_file: Optional[str] = None
    labels: Dict[str, str] = field(default_factory=dict)
    datacenter: Optional[str] = None
    rack: Optional[str] = None
    host_label: Optional[str] = None
    data_listen: Optional[str] = None
    advertise_host: Optional[str] = None
    metrics_listen: Optional[str] = None
    tls_ca: Optional[str] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_server_name: Optional[str] = None
    data_tls: Optional[bool] = None
    insecure: Optional[bool] = None
    reader_group: Optional[str] = None
    timeout_s: float = 120.0
    connections: int = 4
    worker_name: Optional[str] = None
    slices: Optional[bool] = None
    node: Optional[str] = None

    def __post_init__(self) -> None:
        self.hub = self.hub or os.environ.get(th_config.ENV["hub"]) or None
        if self.node is None:
            self.node = os.environ.get("TENSORHUB_NODE") or None
        if not isinstance(self.hub, str) or ":" not in self.hub:
            raise ValueError(
                f"tensorhub init_info: hub must be 'HOST:PORT' (or ${th_config.ENV['hub']}), "
                f"not {self.hub!r}")
        if not isinstance(self.labels, dict):
            raise ValueError(f"tensorhub init_info: labels must be a dict, not {self.labels!r}")
        if not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0:
            raise ValueError(f"tensorhub init_info: timeout_s must be > 0, not {self.timeout_s!r}")
        if not isinstance(self.connections, int) or self.connections < 1:
            raise ValueError(
                f"tensorhub init_info: connections must be an integer >= 1, not {self.connections!r}"
            )

    def settings(self) -> th_config.WorkerSettings:
        """The resolved worker settings (config, then environment, then defaults)."""
        try:
            return th_config.worker_settings(
                {"hub": self.hub, **{k: getattr(self, k) for k in _SETTING_FIELDS}},
                what="tensorhub init_info")
        except InvalidArgumentError as e:
            raise ValueError(str(e)) from None


@dataclass
class TensorHubUpdateInfo(WeightTransferUpdateInfo):
    """``update_info`` of the tensorhub backend.

    Attributes:
        model: the TensorHub model name.
        version: an integer >= 1, or "latest" (the highest committed one; the
            TP ranks agree on it through their reader group).
        stage: only start fetching, in the background, and return; a later
            update of the same version waits for it and applies.
        timeout_s: deadline of the fetch (default: init_info's timeout_s).
        step: the reader-group step (default: this engine's update count,
            equal on every rank since all ranks see the same calls).
    """

    model: str
    version: Union[int, str] = "latest"
    stage: bool = False
    timeout_s: Optional[float] = None
    step: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"tensorhub update_info: model must be a non-empty string, not {self.model!r}")
        self.version = _check_version(self.version, "tensorhub update_info")
        if self.timeout_s is not None and (
            not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0
        ):
            raise ValueError(f"tensorhub update_info: timeout_s must be > 0, not {self.timeout_s!r}")


class _Staged:
    """A fetch running (or finished) in a background thread."""

    def __init__(self, model: str, version: Union[int, str], target: str) -> None:
        self.model = model
        self.requested = version
        self.target = target  # "model" or "draft": which model it is for
        self.version: Optional[int] = None
        self.tensors: Optional[Dict[str, torch.Tensor]] = None
        self.aliases: Dict[str, str] = {}
        self.stats: Optional[FetchStats] = None
        self.error: Optional[BaseException] = None
        self.seconds = 0.0
        # time.monotonic() when the fetch started and ended (this process's
        # clock): lets a caller see what the engine did meanwhile.
        self.started_at: Optional[float] = None
        self.finished_at: Optional[float] = None
        self.done = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.slices = False  # fetched only the boxes its loaders read
        # name -> the box fetched (slices only; a name absent: nothing fetched)
        self.boxes: Optional[Dict[str, Any]] = None
        self.signature: Tuple[Any, ...] = ()  # (name, shape, dtype) of the version
        self.node_copy: Optional[Any] = None  # tensorhub.node.NodeCopy: tensors are its views


class TensorHubWeightTransferEngine(
    WeightTransferEngine[TensorHubInitInfo, TensorHubUpdateInfo]
):
    """Loads weight versions from TensorHub into a vLLM worker (see module doc)."""

    init_info_cls = TensorHubInitInfo
    update_info_cls = TensorHubUpdateInfo
    # A draft model is retargeted through set_weight_update_target (vLLM >=
    # 0.33); its versions are held apart from the target model's.
    supports_draft_weight_update = True

    def __init__(self, config: Any, vllm_config: Any, device: Any, model: Any) -> None:
        super().__init__(config, vllm_config, device, model)
        self._main_model = model
        self._client: Optional[Client] = None
        self._info: Optional[TensorHubInitInfo] = None
        self._group = ""
        self._rank = _tp_rank()
        self._tp = _tp_size()
        self._step = 0
        # What this worker holds and serves, per target ("model", "draft"):
        # (model name, version, tensors).
        self._held: Dict[str, Tuple[str, int, Dict[str, torch.Tensor]]] = {}
        self._staged: Optional[_Staged] = None
        # Per target: (version signature, {name: box its loaders read}).
        self._learned: Dict[str, Tuple[Tuple[Any, ...], Dict[str, Any]]] = {}
        self._stats: Dict[str, Any] = {}
        self._lock = threading.Lock()  # guards _staged and _held
        # Withdrawing the version an apply replaced runs here, after the pause.
        self._withdrawing: Optional[threading.Thread] = None
        self._withdraw_s = 0.0  # the last withdrawal's seconds
        _LIVE.add(self)

    # -- vLLM's interface ----------------------------------------------------

    def parse_update_info(self, update_dict: Dict[str, Any]) -> TensorHubUpdateInfo:
        try:
            return TensorHubUpdateInfo(**update_dict)
        except TypeError as e:
            raise ValueError(
                f"tensorhub update_info {sorted(update_dict)}: {e}; fields: model, version, "
                f"stage, timeout_s, step"
            ) from e

    def parse_init_info(self, init_dict: Dict[str, Any]) -> TensorHubInitInfo:
        try:
            return TensorHubInitInfo(**init_dict)
        except TypeError as e:
            raise ValueError(
                f"tensorhub init_info {sorted(init_dict)}: {e}; fields: hub, "
                f"{', '.join(_SETTING_FIELDS)}, reader_group, timeout_s, connections, "
                f"worker_name, slices, node"
            ) from e

    def init_transfer_engine(self, init_info: TensorHubInitInfo) -> None:
        if self._client is not None:
            raise RuntimeError("tensorhub: init_weight_transfer_engine was already called")
        instance = getattr(self.vllm_config, "instance_id", "") or "0"
        dp = getattr(self.parallel_config, "data_parallel_rank", 0) or 0
        self._group = init_info.reader_group or f"vllm-{instance}-dp{dp}"
        name = init_info.worker_name or f"{self._group}-rank{self._rank}"
        if self._rank and init_info.worker_name:
            name = f"{init_info.worker_name}-rank{self._rank}"
        settings = init_info.settings()
        self._client = connect(worker_id=name, **settings.connect_kwargs())
        self._info = init_info
        logger.info(
            "tensorhub: worker %s (rank %d, reader group %s) joined hub %s, serving at %s (%s)",
            self._client.worker_id, self._rank, self._group, settings.hub,
            self._client.data_address, settings.data_listen_source,
        )

    def start_weight_update(self) -> None:
        self._require_init()

    def receive_weights(self, update_info: TensorHubUpdateInfo) -> None:
        self._require_init()
        step = self._step if update_info.step is None else update_info.step
        self._step += 1
        timeout_s = update_info.timeout_s or self._info.timeout_s  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s
        target = self._target()
        if update_info.stage:
            self._stage(update_info.model, update_info.version, step, deadline, target)
            return
        t0 = time.monotonic()
        staged, waited_s = self._take_staged(update_info, step, deadline, target)
        fetch_s = 0.0
        if staged is None:
            staged = _Staged(update_info.model, update_info.version, target)
            self._fetch(staged, step, deadline)
            fetch_s = staged.seconds
            if staged.error is not None:
                raise staged.error
        t1 = time.monotonic()
        refetched = self._apply(staged, deadline)
        apply_s = time.monotonic() - t1
        self._stats = {
            "worker_id": self._client.worker_id,  # type: ignore[union-attr]
            "rank": self._rank,
            "target": target,
            "model": staged.model,
            "version": staged.version,
            "staged": fetch_s == 0.0,
            "stage_seconds": staged.seconds if fetch_s == 0.0 else 0.0,
            "stage_started_at": staged.started_at if fetch_s == 0.0 else None,
            "stage_finished_at": staged.finished_at if fetch_s == 0.0 else None,
            "wait_seconds": waited_s,
            "fetch_seconds": fetch_s,
            "apply_seconds": apply_s,
            "withdraw_seconds": self._withdraw_s,
            "pause_seconds": time.monotonic() - t0,
            "fetch": asdict(staged.stats) if staged.stats is not None else None,
            "slices": staged.slices,
            "box_bytes": _box_bytes(staged) if staged.slices else None,
            "refetched_whole": refetched,
        }
        logger.info(
            "tensorhub: %s@%s applied: fetch %.3fs (staged %.3fs, waited %.3fs), apply %.3fs",
            staged.model, staged.version, fetch_s, self._stats["stage_seconds"], waited_s, apply_s,
        )

    def finish_weight_update(self) -> None:
        self._require_init()

    def shutdown(self) -> None:
        staged = self._staged
        if staged is not None and staged.thread is not None:
            staged.done.wait(timeout=(self._info.timeout_s if self._info else 10.0))
        self._join_withdraw()
        client, self._client = self._client, None
        if client is not None:
            client.close()
        with self._lock:
            self._held = {}
            self._staged = None

    # -- introspection -------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        with self._lock:
            held = self._held.get("model")
        out = dict(self._stats)
        out.setdefault("worker_id", self._client.worker_id if self._client else None)
        out["data_address"] = self._client.data_address if self._client else None
        out["holding"] = None if held is None else [held[0], held[1]]
        return out

    # -- internals -----------------------------------------------------------

    def _target(self) -> str:
        """Which model an update goes to: "model", or "draft" while vLLM has
        retargeted the engine at the speculative draft model."""
        return "model" if self.model is self._main_model else "draft"

    def _require_init(self) -> None:
        if self._client is None:
            raise RuntimeError(
                "tensorhub: call init_weight_transfer_engine({'init_info': {'hub': 'HOST:PORT'}}) "
                "before a weight update"
            )

    def _stage(self, model: str, version: Union[int, str], step: int, deadline: float,
               target: str) -> None:
        with self._lock:
            old = self._staged
            if old is not None and not old.done.is_set():
                raise RuntimeError(
                    f"tensorhub: a staged fetch of {old.model}@{old.requested} is still running; "
                    f"apply it (update_weights without stage) before staging another"
                )
            staged = _Staged(model, version, target)
            staged.thread = threading.Thread(
                target=self._fetch, args=(staged, step, deadline),
                name=f"tensorhub-stage-{model}", daemon=True,
            )
            self._staged = staged
        staged.thread.start()

    def _take_staged(
        self, info: TensorHubUpdateInfo, step: int, deadline: float, target: str
    ) -> Tuple[Optional[_Staged], float]:
        """The staged fetch of the requested version, waited for; else None."""
        with self._lock:
            staged = self._staged
        if staged is None or staged.model != info.model or staged.target != target:
            return None, 0.0
        t0 = time.monotonic()
        if not staged.done.wait(timeout=max(0.0, deadline - time.monotonic())):
            raise DeadlineExceededError(
                f"tensorhub: the staged fetch of {staged.model}@{staged.requested} did not "
                f"finish within the deadline"
            )
        waited_s = time.monotonic() - t0
        with self._lock:
            self._staged = None
        if info.version == "latest":
            # "latest" resolves through the reader group: the staged version
            # is used only if it is what the group resolves now.
            want = self._client.describe(info.model, "latest", group=self._group, step=step).version  # type: ignore[union-attr]
        else:
            want = info.version
        if staged.error is not None:
            if staged.requested in (want, "latest"):
                raise staged.error
            return None, waited_s
        if staged.version != want:
            self._drop(staged)
            return None, waited_s
        return staged, waited_s

    def _describe_committed(self, client: Client, staged: _Staged, step: int,
                            deadline: float) -> Any:
        """The version's description once it is committed: a trainer of
        several ranks commits when the last rank published, which may be
        after the sender told the engines to load. Waits (polling with
        backoff) within the deadline."""
        delay_s = 0.005
        while True:
            last: Any = None
            try:
                info = client.describe(staged.model, staged.requested, group=self._group, step=step)
                if info.committed:
                    return info
                if info.state not in ("PENDING",):
                    raise FailedPreconditionError(
                        f"tensorhub: {staged.model}@{info.version} is {info.state}, not loadable")
                last = f"{info.state}, {info.parts_published} of {info.group_size} ranks published"
            except UnavailableError as e:  # a hub restarting: retried within the deadline
                last = e
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceededError(
                    f"tensorhub: {staged.model}@{staged.requested} was not committed within the "
                    f"update's deadline (last answer: {last})")
            time.sleep(min(delay_s, left))
            delay_s = min(delay_s * 2, 0.1)

    def _fetch(self, staged: _Staged, step: int, deadline: float) -> None:
        """Fetches into fresh buffers; records the error instead of raising."""
        client = self._client
        t0 = staged.started_at = time.monotonic()
        try:
            assert client is not None
            info = self._describe_committed(client, staged, step, deadline)
            raw = info.metadata.get(ALIASES_KEY, "{}")
            try:
                staged.aliases = json.loads(raw) if isinstance(raw, str) else {}
            except ValueError:
                raise InvalidArgumentError(
                    f"tensorhub: {staged.model}@{info.version} has malformed {ALIASES_KEY}"
                ) from None
            staged.signature = tuple((t.name, tuple(t.shape), t.dtype) for t in info.tensors)
            with self._lock:
                held = self._held.get(staged.target)
            if held is not None and (held[0], held[1]) == (staged.model, info.version):
                # Already held (and served) here: a fetch would read from itself.
                staged.version, staged.tensors = info.version, held[2]
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceededError(
                    f"tensorhub: no time left to fetch {staged.model}@{info.version}"
                )
            if self._info.node:  # type: ignore[union-attr]
                # The host's one copy (tensorhub.node), if its agent serves it.
                from . import node

                copy = node.acquire_or_none(staged.model, info.version, socket=self._info.node,
                                            timeout=remaining)
                if copy is not None:
                    staged.version, staged.node_copy = info.version, copy
                    staged.tensors = copy.tensors("torch")
                    return
            learned = self._learned.get(staged.target)
            if self._slices() and learned is not None and learned[0] == staged.signature:
                out = self._fetch_boxes(client, staged, info, learned[1], remaining)
            else:
                out = info.empty("torch")
                staged.stats = client.fetch(
                    staged.model, info.version, into=out, timeout=remaining,
                    connections=self._info.connections,  # type: ignore[union-attr]
                    return_stats=True)
            staged.version = info.version
            staged.tensors = out
        except BaseException as e:  # handed to the caller of update_weights
            staged.error = e
        finally:
            staged.finished_at = time.monotonic()
            staged.seconds = staged.finished_at - t0
            staged.done.set()

    def _slices(self) -> bool:
        slices = self._info.slices  # type: ignore[union-attr]
        return self._tp > 1 if slices is None else bool(slices)

    def _fetch_boxes(self, client: Client, staged: _Staged, info: Any,
                     boxes: Dict[str, Any], remaining: float) -> Dict[str, torch.Tensor]:
        """Fetches only the boxes this rank's loaders read (learned), into
        full-shape tensors that the loaders narrow to exactly those boxes;
        they are served onward to the same rank of other engines (a holder
        of slices). Bytes outside the boxes are never read: the load is
        traced, and a read outside them refetches (see _apply)."""
        full: Dict[str, torch.Tensor] = {}
        into: Dict[str, Tuple[torch.Tensor, Any]] = {}
        copies = []
        for t in info.tensors:
            buf = torch.empty(list(t.shape), dtype=t.torch_dtype())
            full[t.name] = buf
            box = boxes.get(t.name)
            if box is None or not all(box[1]):
                continue
            region = buf[tuple(slice(o, o + e) for o, e in zip(box[0], box[1]))]
            if region.is_contiguous():
                into[t.name] = (region, (list(box[0]), list(box[1])))
            else:
                dest = torch.empty(list(box[1]), dtype=buf.dtype)
                into[t.name] = (dest, (list(box[0]), list(box[1])))
                copies.append((region, dest))
        if into:
            staged.stats = client.fetch(
                staged.model, info.version, into=into, timeout=remaining,
                connections=self._info.connections,  # type: ignore[union-attr]
                return_stats=True, serve_slices=True,
            )
        for region, dest in copies:
            region.copy_(dest)
        staged.slices = True
        staged.boxes = {n: b for n, b in boxes.items() if n in into}
        return full

    def _drop(self, staged: _Staged) -> None:
        if staged.node_copy is not None:
            staged.tensors, copy, staged.node_copy = None, staged.node_copy, None
            copy.close()
            return
        with self._lock:
            held = self._held.get(staged.target)
            if held is not None and staged.tensors is held[2]:
                return  # the version in use, not a separate stage
        if staged.version is not None and staged.tensors is not None and self._client:
            try:
                self._client.unpublish(staged.model, staged.version)
            except Exception as e:  # noqa: BLE001 - a dropped stage is best effort
                logger.warning("tensorhub: dropping staged %s@%s: %s", staged.model, staged.version, e)

    def _weights(self, staged: _Staged) -> Iterator[Tuple[str, torch.Tensor]]:
        assert staged.tensors is not None
        yield from staged.tensors.items()
        for alias, name in staged.aliases.items():
            yield alias, staged.tensors[name]

    def _load(self, staged: _Staged) -> Dict[str, Any]:
        """Loads the staged tensors into the target model (vLLM's layerwise
        reload, as its checkpoint-format backends do); returns the boxes the
        loaders read when the slice path traces them, else {}."""
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        from .read_trace import ReadTrace

        trace = ReadTrace(staged.tensors) if self._slices() else None  # type: ignore[arg-type]
        with trace if trace is not None else _nullcontext():
            initialize_layerwise_reload(self.model)
            self.model.load_weights(self._weights(staged))
            finalize_layerwise_reload(self.model, self.model_config)
        return trace.boxes if trace is not None else {}

    def _apply(self, staged: _Staged, deadline: float) -> bool:
        """Loads ``staged``; returns True when a read outside the fetched
        boxes made it fetch the whole tensors and load again."""
        from .read_trace import contains

        read = self._load(staged)
        refetched = False
        if staged.boxes is not None:
            escaped = sorted(n for n, b in read.items()
                             if n not in staged.boxes or not contains(staged.boxes[n], b))
            if escaped:
                # A loader read bytes this rank did not fetch: the model may
                # hold garbage there. Fetch the whole version and load again.
                logger.warning(
                    "tensorhub: %s@%s: the loaders read outside the fetched boxes of %s; "
                    "fetching the whole tensors and loading again",
                    staged.model, staged.version, escaped[:5])
                self._client.unpublish(staged.model, staged.version)  # type: ignore[union-attr]
                info = self._client.describe(staged.model, staged.version)  # type: ignore[union-attr]
                out = info.empty("torch")
                staged.stats = self._client.fetch(  # type: ignore[union-attr]
                    staged.model, info.version, into=out,
                    timeout=max(0.001, deadline - time.monotonic()),
                    connections=self._info.connections,  # type: ignore[union-attr]
                    return_stats=True)
                staged.tensors, staged.boxes, staged.slices = out, None, False
                read = self._load(staged)
                refetched = True
        if self._slices() and staged.boxes is None:
            # A whole load: what its loaders read is what later updates fetch.
            self._learned[staged.target] = (staged.signature, read)
        # The new version is in the model: serve it, and withdraw the old one
        # in the background (unpublish waits for its reads in flight, and the
        # engine need not wait for that: the pause covers the apply only).
        # Loaded from the node's copy: nothing to serve, the agent does.
        new = (staged.model, staged.version, staged.tensors)
        if staged.node_copy is not None:
            staged.tensors, copy, staged.node_copy, new = None, staged.node_copy, None, None
            copy.close()
        with self._lock:
            old = self._held.get(staged.target)
            if new is None:
                self._held.pop(staged.target, None)
            else:
                self._held[staged.target] = new  # type: ignore[assignment]
        if old is not None and (old[0], old[1]) != (staged.model, staged.version):
            self._join_withdraw()
            # The thread holds `old`, so its buffers live until the drain ends.
            self._withdrawing = threading.Thread(
                target=self._withdraw, args=(old,), name="tensorhub-withdraw", daemon=True
            )
            self._withdrawing.start()
        return refetched

    def _withdraw(self, old: Tuple[str, int, Dict[str, torch.Tensor]]) -> None:
        t0 = time.monotonic()
        try:
            self._client.unpublish(old[0], old[1])  # type: ignore[union-attr]
        except Exception as e:  # noqa: BLE001 - the new weights are loaded already
            logger.warning("tensorhub: withdrawing %s@%s: %s", old[0], old[1], e)
        self._withdraw_s = time.monotonic() - t0

    def _join_withdraw(self) -> None:
        """Waits for the previous withdrawal (done long before, as a rule)."""
        t = self._withdrawing
        if t is None:
            return
        t.join(timeout=self._info.timeout_s if self._info else 10.0)
        if t.is_alive():
            logger.warning("tensorhub: withdrawing an old version is still waiting for its reads")
        else:
            self._withdrawing = None


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _box_bytes(staged: _Staged) -> int:
    if not staged.boxes or not staged.tensors:
        return 0
    n = 0
    for name, (_, ext) in staged.boxes.items():
        k = staged.tensors[name].element_size()
        for e in ext:
            k *= int(e)
        n += k
    return n


def _tp_size() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_world_size

        return int(get_tensor_model_parallel_world_size())
    except Exception:  # noqa: BLE001 - not initialised (unit tests): 1
        return 1


def _tp_rank() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # noqa: BLE001 - not initialised (unit tests): rank 0
        return 0


# -- trainer side ----------------------------------------------------------


@dataclass
class TensorHubTrainerInitInfo(TrainerInitInfo):
    """Trainer-side init info of the tensorhub backend.

    ``trainer_init`` runs on every trainer rank, and every rank publishes
    its own shard (see :mod:`tensorhub.pieces`); rank 0 (``is_sender``)
    also drives the engines.

    Attributes:
        hub: HOST:PORT of the hub (default ``$TENSORHUB_HUB``).
        model: the TensorHub model name versions are published under.
        secret_file, data_listen, advertise_host, metrics_listen, tls_ca,
            tls_cert, tls_key, tls_server_name, data_tls, insecure,
            datacenter, rack, host_label (or ``labels``): this trainer
            rank's worker settings (:mod:`tensorhub.config`); the engines
            get the hub, secret file and TLS files from here.
        engine_init: extra ``init_info`` fields for the engines (labels,
            reader_group, timeout_s, ...).
        timeout_s: deadline of each engine's fetch.
        first_version: the lowest version number to use; a trainer starts
            above the highest version the hub knows of ``model`` (a
            restarted trainer whose hub still holds the last run's
            versions), then counts up by one per send.
        world_size: ranks of the trainer group that publish one version
            together (default: torch.distributed's world size when it is
            initialised, else 1).
    """

    backend = "tensorhub"
    hub: Optional[str] = None
    model: str = "policy"
    secret_file: Optional[str] = None
    labels: Dict[str, str] = field(default_factory=dict)
    datacenter: Optional[str] = None
    rack: Optional[str] = None
    host_label: Optional[str] = None
    data_listen: Optional[str] = None
    advertise_host: Optional[str] = None
    metrics_listen: Optional[str] = None
    tls_ca: Optional[str] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_server_name: Optional[str] = None
    data_tls: Optional[bool] = None
    insecure: Optional[bool] = None
    engine_init: Dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 120.0
    first_version: int = 1
    world_size: Optional[int] = None


def _meta_list(source: Any) -> list:
    """A source's metadata: a cached property in vLLM >= 0.33, a method before."""
    m = source.metadata
    return list(m() if callable(m) else m)


class _TensorSource(WeightSource):
    """A WeightSource over a fixed mapping of named tensors (vLLM 0.32 and 0.33)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self._tensors = dict(tensors)

    @cached_property
    def metadata(self) -> list:  # type: ignore[override]
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self._tensors.items()]

    def iter_full(self) -> Iterator[Tuple[str, torch.Tensor]]:
        yield from self._tensors.items()

    def __iter__(self) -> Iterator[Tuple[str, torch.Tensor]]:
        return self.iter_full()


def _default_world_size() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:  # noqa: BLE001 - no process group: one rank
        pass
    return 1


def _agree_max(value: int, world: int) -> int:
    """The highest ``value`` of the group's ranks (an all-reduce over
    torch.distributed's default group when it is the trainer group), so
    that every rank publishes the same version number even when one asked
    the hub after another had published."""
    if world == 1:
        return value
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != world:
        return value
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _share_of(src: Any, rank: int, world: int, pieces: Any, what: str) -> LocalShare:
    """This rank's share of a mapping or a WeightSource (see tensorhub.pieces)."""
    if isinstance(src, Mapping):
        return local_share(src.items(), rank, world, pieces=pieces, what=what)
    impl_local = getattr(src, "implements_iter_local", None)
    if callable(impl_local) and impl_local():
        metas = _meta_list(src)
        if any(m.owners is not None for m in metas):
            return meta_share(src, rank, world, what=what)
    impl_full = getattr(src, "implements_iter_full", None)
    if callable(impl_full) and impl_full():
        items = src.iter_full()  # vLLM >= 0.33
    else:
        items = iter(src)  # vLLM 0.32: sources are iterables
    return local_share(items, rank, world, pieces=pieces, what=what)


class TensorHubTrainerWeightTransferEngine(
    TrainerWeightTransferEngine[TensorHubTrainerInitInfo]
):
    """Publishes the trainer's weights as TensorHub versions, tells engines to load.

    ``send_weights()`` publishes one version (every rank its own shard, in
    place: engines read the trainer's memory, host or device) and the sender
    drives every engine through ``start_weight_update`` / ``update_weights``
    / ``finish_weight_update``. The version stays published until
    :meth:`release`, which waits for reads in flight: call it on every rank
    before the optimizer changes the weights in place (the engines hold and
    serve the version by then, so it stays fetchable).
    """

    init_info_cls = TensorHubTrainerInitInfo

    def __init__(
        self,
        init_info: TensorHubTrainerInitInfo,
        hub_client: Client,
        *,
        client: Any,
        source: Optional[WeightSource],
        is_sender: bool,
        world_size: int = 1,
        next_version: int = 1,
    ) -> None:
        try:
            super().__init__(client=client, source=source, is_sender=is_sender,
                             rank=init_info.rank)
        except TypeError:  # vLLM 0.32: no rank argument
            super().__init__(client=client, source=source, is_sender=is_sender)
            self.rank = init_info.rank
        self.init_info = init_info
        self.hub_client = hub_client
        self.world_size = world_size
        self.next_version = next_version
        self.published: Optional[int] = None
        self.last_share: Optional[LocalShare] = None
        self.last_timings: Dict[str, float] = {}

    @classmethod
    def trainer_init(
        cls,
        init_info: TensorHubTrainerInitInfo,
        *,
        client: Any,
        source: Optional[WeightSource] = None,
    ) -> "TensorHubTrainerWeightTransferEngine":
        init_info.hub = init_info.hub or os.environ.get(th_config.ENV["hub"]) or ""
        if ":" not in init_info.hub:
            raise ValueError(f"tensorhub trainer init_info: hub must be 'HOST:PORT', not {init_info.hub!r}")
        if isinstance(init_info.first_version, bool) or init_info.first_version < 1:
            raise ValueError("tensorhub trainer init_info: first_version must be >= 1")
        world = init_info.world_size or _default_world_size()
        if not 0 <= init_info.rank < world:
            raise ValueError(f"tensorhub trainer init_info: rank {init_info.rank} is not in a "
                             f"group of {world} (world_size)")
        try:
            settings = th_config.worker_settings(
                {"hub": init_info.hub, **{k: getattr(init_info, k) for k in _SETTING_FIELDS}},
                what="tensorhub trainer init_info")
        except InvalidArgumentError as e:
            raise ValueError(str(e)) from None
        name = f"trainer-{init_info.model}" + (f"-rank{init_info.rank}" if world > 1 else "")
        hub_client = connect(worker_id=name, **settings.connect_kwargs())
        # Above whatever the hub holds of this model: a restarted trainer
        # whose hub still has the versions of the run before.
        known = [v.version for v in hub_client.versions(init_info.model)]
        next_version = _agree_max(max([int(init_info.first_version)] + [v + 1 for v in known]),
                                  world)
        if init_info.is_sender:
            engine_init = {**settings.for_peers(), "timeout_s": init_info.timeout_s}
            engine_init.update(init_info.engine_init)
            client.init_weight_transfer_engine(engine_init)
        return cls(init_info, hub_client, client=client, source=source,
                   is_sender=init_info.is_sender, world_size=world, next_version=next_version)  # type: ignore[arg-type]

    def publish(
        self, tensors: Optional[Mapping[str, torch.Tensor]] = None, version: Optional[int] = None,
        *, pieces: Optional[Mapping[str, Tuple[Any, Any]]] = None,
    ) -> int:
        """Publishes this rank's share of ``tensors`` (default: the source) as
        the next version; returns it. Every rank of the group calls it.

        DTensors publish their local shard as a piece, plain tensors are
        published by one rank each, ``pieces`` names explicit TP shards
        ``{name: (global_shape, offset)}`` (see :mod:`tensorhub.pieces`).
        Nothing is gathered or copied unless a tensor's layout needs it.
        Withdraws the previously published version first (waiting for its
        reads).
        """
        src: Any = tensors if tensors is not None else self.source
        if src is None:
            raise ValueError("tensorhub: publish needs tensors or a source given at trainer_init")
        v = self.next_version if version is None else int(version)
        if v < self.next_version:
            raise ValueError(f"tensorhub: version {v} is not above the last sent ({self.next_version - 1})")
        what = f"tensorhub publish {self.init_info.model}@{v} rank {self.rank}"
        share = _share_of(src, self.rank, self.world_size, pieces, what)
        md = {ALIASES_KEY: json.dumps(share.aliases, sort_keys=True)} if share.aliases else None
        self.release()
        self.hub_client.publish(
            self.init_info.model, v, share.tensors, rank=self.rank, group_size=self.world_size,
            metadata=md, pieces=share.pieces or None,
        )
        self.published = v
        self.next_version = v + 1
        self.last_share = share
        return v

    def load(self, version: Union[int, str], *, stage: bool = False) -> None:
        """Tells the engines to load (or, with ``stage``, prefetch) ``version``
        (sender only; other ranks return)."""
        if not self.is_sender:
            return
        info = {"model": self.init_info.model, "version": version, "timeout_s": self.init_info.timeout_s}
        if stage:
            info["stage"] = True
        t0 = time.monotonic()
        self.client.start_weight_update()
        self.client.update_weights(info)
        self.client.finish_weight_update(**({} if stage else {"weight_version": str(version)}))
        self.last_timings["stage_call_seconds" if stage else "load_seconds"] = time.monotonic() - t0

    def send_weights(self, tensors: Optional[Mapping[str, torch.Tensor]] = None) -> int:
        """Publishes the next version and makes every engine load it; returns it."""
        t0 = time.monotonic()
        v = self.publish(tensors)
        self.last_timings = {"publish_seconds": time.monotonic() - t0}
        self.load(v)
        return v

    def release(self, timeout: float = 30.0) -> None:
        """Withdraws the published version (waits for reads in flight)."""
        if self.published is not None and self.hub_client is not None:
            v, self.published = self.published, None
            self.hub_client.unpublish(self.init_info.model, v, timeout=timeout)

    def shutdown(self) -> None:
        self.release()
        if self.hub_client is not None:
            self.hub_client.close()
            self.hub_client = None  # type: ignore[assignment]


class LLMClient:
    """A ``VLLMWeightSyncClient`` over in-process ``vllm.LLM`` objects.

    Calls each engine in turn (in list order), so a later engine can read
    from an earlier one that already holds the version.
    """

    def __init__(self, llms: Any) -> None:
        self.llms = list(llms) if isinstance(llms, (list, tuple)) else [llms]
        if not self.llms:
            raise ValueError("LLMClient needs at least one LLM")

    def init_weight_transfer_engine(self, init_info: Dict[str, Any]) -> None:
        for llm in self.llms:
            llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        for llm in self.llms:
            llm.start_weight_update()

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        for llm in self.llms:
            llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: Optional[str] = None) -> None:
        for llm in self.llms:
            llm.finish_weight_update(weight_version)


__all__ = [
    "TensorHubInitInfo",
    "TensorHubUpdateInfo",
    "TensorHubWeightTransferEngine",
    "TensorHubTrainerInitInfo",
    "TensorHubTrainerWeightTransferEngine",
    "LLMClient",
    "live_engine_stats",
]
