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
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
    materialize_full_tensor,
)
from vllm.logger import init_logger

from .client import Client, FetchStats, connect
from .errors import DeadlineExceededError, FailedPreconditionError, InvalidArgumentError
from .torch import ALIASES_KEY, _group_ties

logger = init_logger(__name__)

_LIVE: "weakref.WeakSet[TensorHubWeightTransferEngine]" = weakref.WeakSet()


def live_engine_stats() -> List[Dict[str, Any]]:
    """The last update's timings of every live engine in this process."""
    return [e.stats() for e in list(_LIVE)]


def _read_secret(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            secret = f.read().strip()
    except OSError as e:
        raise ValueError(f"tensorhub: cannot read secret_file {path!r}: {e}") from e
    if not secret:
        raise ValueError(f"tensorhub: secret_file {path!r} is empty")
    return secret


def _check_version(version: Any, what: str) -> Union[int, str]:
    if version == "latest":
        return "latest"
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{what}: version must be an integer >= 1 or \"latest\", not {version!r}")
    return version


# -- worker side -----------------------------------------------------------


@dataclass
class TensorHubInitInfo(WeightTransferInitInfo):
    """``init_info`` of the tensorhub backend (a JSON object over HTTP).

    Attributes:
        hub: HOST:PORT of the TensorHub hub.
        secret_file: file holding the hub's shared secret (default: none, or
            ``$TENSORHUB_SECRET``).
        labels: where this engine runs, ``{"datacenter", "rack", "host"}``.
        reader_group: id shared by the TP ranks of this engine (default:
            derived from vLLM's instance id, which all its workers share).
        data_listen: HOST:PORT where the engine serves reads to other workers
            (port 0: any); ``advertise_host`` is the address others dial.
        timeout_s: default deadline of one fetch, in seconds.
        connections: parallel data streams per fetch.
        worker_name: name in the hub's listings (default vllm-GROUP-rankN).
        slices: fetch only this TP rank's slice of each tensor (the layout
            helpers' boxes, as vLLM's loaders split them) and serve those
            slices onward to the same rank of other engines. Default: when
            tensor_parallel_size > 1. True at TP 1 takes the same path with
            whole-tensor boxes (what the tests run on a CPU vLLM).
        node: the socket of this host's node agent (``tensorhub node``;
            ``"@tensorhub-node"`` or a path; default ``$TENSORHUB_NODE``,
            else none): updates load straight from the host's one copy
            (tensorhub.node), and fetch for themselves, saying so, when the
            agent does not answer.
    """

    hub: str
    secret_file: Optional[str] = None
    labels: Dict[str, str] = field(default_factory=dict)
    reader_group: Optional[str] = None
    data_listen: str = "127.0.0.1:0"
    advertise_host: str = ""
    timeout_s: float = 120.0
    connections: int = 4
    worker_name: Optional[str] = None
    slices: Optional[bool] = None
    node: Optional[str] = None

    def __post_init__(self) -> None:
        if self.node is None:
            self.node = os.environ.get("TENSORHUB_NODE") or None
        if not isinstance(self.hub, str) or ":" not in self.hub:
            raise ValueError(f"tensorhub init_info: hub must be 'HOST:PORT', not {self.hub!r}")
        if not isinstance(self.labels, dict):
            raise ValueError(f"tensorhub init_info: labels must be a dict, not {self.labels!r}")
        if not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0:
            raise ValueError(f"tensorhub init_info: timeout_s must be > 0, not {self.timeout_s!r}")
        if not isinstance(self.connections, int) or self.connections < 1:
            raise ValueError(
                f"tensorhub init_info: connections must be an integer >= 1, not {self.connections!r}"
            )


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

    def __init__(self, model: str, version: Union[int, str]) -> None:
        self.model = model
        self.requested = version
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
        self.slices = False  # fetched this rank's slices only
        self.node_copy: Optional[Any] = None  # tensorhub.node.NodeCopy: tensors are its views


class TensorHubWeightTransferEngine(
    WeightTransferEngine[TensorHubInitInfo, TensorHubUpdateInfo]
):
    """Loads weight versions from TensorHub into a vLLM worker (see module doc)."""

    init_info_cls = TensorHubInitInfo
    update_info_cls = TensorHubUpdateInfo

    def __init__(self, config: Any, vllm_config: Any, device: Any, model: Any) -> None:
        super().__init__(config, vllm_config, device, model)
        self._client: Optional[Client] = None
        self._info: Optional[TensorHubInitInfo] = None
        self._group = ""
        self._rank = _tp_rank()
        self._tp = _tp_size()
        self._step = 0
        # What this worker holds and serves: (model, version) -> tensors.
        self._held: Optional[Tuple[str, int, Dict[str, torch.Tensor]]] = None
        self._staged: Optional[_Staged] = None
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
                f"tensorhub init_info {sorted(init_dict)}: {e}; fields: hub, secret_file, "
                f"labels, reader_group, data_listen, advertise_host, timeout_s, connections, "
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
        self._client = connect(
            init_info.hub,
            worker_id=name,
            labels=init_info.labels,
            data_listen=init_info.data_listen,
            advertise_host=init_info.advertise_host,
            secret=_read_secret(init_info.secret_file),
        )
        self._info = init_info
        logger.info(
            "tensorhub: worker %s (rank %d, reader group %s) joined hub %s, serving at %s",
            self._client.worker_id, self._rank, self._group, init_info.hub,
            self._client.data_address,
        )

    def start_weight_update(self) -> None:
        self._require_init()

    def receive_weights(self, update_info: TensorHubUpdateInfo) -> None:
        self._require_init()
        step = self._step if update_info.step is None else update_info.step
        self._step += 1
        timeout_s = update_info.timeout_s or self._info.timeout_s  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s
        if update_info.stage:
            self._stage(update_info.model, update_info.version, step, deadline)
            return
        t0 = time.monotonic()
        staged, waited_s = self._take_staged(update_info, step, deadline)
        fetch_s = 0.0
        if staged is None:
            staged = _Staged(update_info.model, update_info.version)
            self._fetch(staged, step, deadline)
            fetch_s = staged.seconds
            if staged.error is not None:
                raise staged.error
        t1 = time.monotonic()
        self._apply(staged)
        apply_s = time.monotonic() - t1
        self._stats = {
            "worker_id": self._client.worker_id,  # type: ignore[union-attr]
            "rank": self._rank,
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
            self._held = None
            self._staged = None

    # -- introspection -------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        with self._lock:
            held = self._held
        out = dict(self._stats)
        out.setdefault("worker_id", self._client.worker_id if self._client else None)
        out["holding"] = None if held is None else [held[0], held[1]]
        return out

    # -- internals -----------------------------------------------------------

    def _require_init(self) -> None:
        if self._client is None:
            raise RuntimeError(
                "tensorhub: call init_weight_transfer_engine({'init_info': {'hub': 'HOST:PORT'}}) "
                "before a weight update"
            )

    def _stage(self, model: str, version: Union[int, str], step: int, deadline: float) -> None:
        with self._lock:
            old = self._staged
            if old is not None and not old.done.is_set():
                raise RuntimeError(
                    f"tensorhub: a staged fetch of {old.model}@{old.requested} is still running; "
                    f"apply it (update_weights without stage) before staging another"
                )
            staged = _Staged(model, version)
            staged.thread = threading.Thread(
                target=self._fetch, args=(staged, step, deadline),
                name=f"tensorhub-stage-{model}", daemon=True,
            )
            self._staged = staged
        staged.thread.start()

    def _take_staged(
        self, info: TensorHubUpdateInfo, step: int, deadline: float
    ) -> Tuple[Optional[_Staged], float]:
        """The staged fetch of the requested version, waited for; else None."""
        with self._lock:
            staged = self._staged
        if staged is None or staged.model != info.model:
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

    def _fetch(self, staged: _Staged, step: int, deadline: float) -> None:
        """Fetches into fresh buffers; records the error instead of raising."""
        client = self._client
        t0 = staged.started_at = time.monotonic()
        try:
            assert client is not None
            info = client.describe(staged.model, staged.requested, group=self._group, step=step)
            if not info.committed:
                raise FailedPreconditionError(
                    f"tensorhub: {staged.model}@{info.version} is {info.state}, not loadable"
                )
            raw = info.metadata.get(ALIASES_KEY, "{}")
            try:
                staged.aliases = json.loads(raw) if isinstance(raw, str) else {}
            except ValueError:
                raise InvalidArgumentError(
                    f"tensorhub: {staged.model}@{info.version} has malformed {ALIASES_KEY}"
                ) from None
            with self._lock:
                held = self._held
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
            slices = self._info.slices  # type: ignore[union-attr]
            if self._tp > 1 if slices is None else slices:
                out = self._fetch_rank_slices(client, staged, info, remaining)
                staged.slices = True
            else:
                out = info.empty("torch")
                staged.stats = client.fetch(
                    staged.model, info.version, into=out, timeout=remaining,
                    connections=self._info.connections,  # type: ignore[union-attr]
                    return_stats=True,
                )
            staged.version = info.version
            staged.tensors = out
        except BaseException as e:  # handed to the caller of update_weights
            staged.error = e
        finally:
            staged.finished_at = time.monotonic()
            staged.seconds = staged.finished_at - t0
            staged.done.set()

    def _fetch_rank_slices(self, client: Client, staged: _Staged, info: Any,
                           remaining: float) -> Dict[str, torch.Tensor]:
        """TP > 1: fetch only this rank's box of each tensor (the layout
        helpers' TpRankBox, which splits as vLLM's loaders do), into
        full-shape tensors that vLLM's ``load_weights`` narrows to exactly
        that box; the slices are served onward to the same rank of other
        engines (a holder of slices)."""
        from .reshard import tp_rank_buffers

        shapes = {t.name: (t.shape, t.torch_dtype()) for t in info.tensors}
        hf_config = getattr(self.model_config, "hf_config", None)
        full, into, finish = tp_rank_buffers(shapes, self._rank, self._tp, hf_config)
        staged.stats = client.fetch(
            staged.model, info.version, into=into, timeout=remaining,
            connections=self._info.connections,  # type: ignore[union-attr]
            return_stats=True, serve_slices=True,
        )
        finish()
        return full

    def _drop(self, staged: _Staged) -> None:
        if staged.node_copy is not None:
            staged.tensors, copy, staged.node_copy = None, staged.node_copy, None
            copy.close()
            return
        with self._lock:
            if self._held is not None and staged.tensors is self._held[2]:
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

    def _apply(self, staged: _Staged) -> None:
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        initialize_layerwise_reload(self.model)
        self.model.load_weights(self._weights(staged))
        finalize_layerwise_reload(self.model, self.model_config)
        # The new version is in the model: serve it, and withdraw the old one
        # in the background (unpublish waits for its reads in flight, and the
        # engine need not wait for that: the pause covers the apply only).
        # Loaded from the node's copy: nothing to serve, the agent does.
        new = (staged.model, staged.version, staged.tensors)
        if staged.node_copy is not None:
            staged.tensors, copy, staged.node_copy, new = None, staged.node_copy, None, None
            copy.close()
        with self._lock:
            old, self._held = self._held, new  # type: ignore[assignment]
        if old is not None and (old[0], old[1]) != (staged.model, staged.version):
            self._join_withdraw()
            # The thread holds `old`, so its buffers live until the drain ends.
            self._withdrawing = threading.Thread(
                target=self._withdraw, args=(old,), name="tensorhub-withdraw", daemon=True
            )
            self._withdrawing.start()

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

    Attributes:
        hub: HOST:PORT of the hub.
        model: the TensorHub model name versions are published under.
        secret_file: file with the hub's shared secret.
        labels: where the trainer runs.
        engine_init: extra ``init_info`` fields for the engines (labels,
            reader_group, timeout_s, ...); ``hub`` and ``secret_file`` are
            passed on from here.
        timeout_s: deadline of each engine's fetch.
        first_version: the version number of the first send (then +1 each).
    """

    backend = "tensorhub"
    hub: str = ""
    model: str = "policy"
    secret_file: Optional[str] = None
    labels: Dict[str, str] = field(default_factory=dict)
    engine_init: Dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 120.0
    first_version: int = 1


class _TensorSource(WeightSource):
    """A WeightSource over a fixed mapping of named tensors."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self._tensors = dict(tensors)

    def metadata(self) -> list:
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self._tensors.items()]

    def __iter__(self) -> Iterator[Tuple[str, torch.Tensor]]:
        yield from self._tensors.items()


class TensorHubTrainerWeightTransferEngine(
    TrainerWeightTransferEngine[TensorHubTrainerInitInfo]
):
    """Publishes the trainer's weights as TensorHub versions, tells engines to load.

    ``send_weights()`` publishes one version of ``source`` (no copy of CPU
    tensors: engines read the trainer's memory) and drives every engine
    through ``start_weight_update`` / ``update_weights`` /
    ``finish_weight_update``. The version stays published until
    :meth:`release`, which waits for reads in flight: call it before the
    optimizer changes the weights in place (the engines hold and serve the
    version by then, so it stays fetchable).
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
    ) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.init_info = init_info
        self.hub_client = hub_client
        self.next_version = int(init_info.first_version)
        self.published: Optional[int] = None
        self.last_timings: Dict[str, float] = {}

    @classmethod
    def trainer_init(
        cls,
        init_info: TensorHubTrainerInitInfo,
        *,
        client: Any,
        source: Optional[WeightSource] = None,
    ) -> "TensorHubTrainerWeightTransferEngine":
        if not init_info.hub or ":" not in init_info.hub:
            raise ValueError(f"tensorhub trainer init_info: hub must be 'HOST:PORT', not {init_info.hub!r}")
        if isinstance(init_info.first_version, bool) or init_info.first_version < 1:
            raise ValueError("tensorhub trainer init_info: first_version must be >= 1")
        hub_client = None
        if init_info.is_sender:
            hub_client = connect(
                init_info.hub, worker_id=f"trainer-{init_info.model}",
                labels=init_info.labels, secret=_read_secret(init_info.secret_file),
            )
            engine_init = {"hub": init_info.hub, "timeout_s": init_info.timeout_s}
            if init_info.secret_file:
                engine_init["secret_file"] = init_info.secret_file
            engine_init.update(init_info.engine_init)
            client.init_weight_transfer_engine(engine_init)
        return cls(init_info, hub_client, client=client, source=source, is_sender=init_info.is_sender)  # type: ignore[arg-type]

    def publish(
        self, tensors: Optional[Mapping[str, torch.Tensor]] = None, version: Optional[int] = None
    ) -> int:
        """Publishes ``tensors`` (default: the source) as the next version; returns it.

        CPU contiguous tensors are published in place; others are copied to
        host memory first. Tied tensors are published once. Withdraws the
        previously published version first (waiting for its reads).
        """
        src: Any = tensors if tensors is not None else self.source
        if src is None:
            raise ValueError("tensorhub: publish needs tensors or a source given at trainer_init")
        items = list(src.items()) if isinstance(src, Mapping) else list(iter(src))
        if not self.is_sender:
            return self.next_version  # the collectives ran; only rank 0 publishes
        v = self.next_version if version is None else int(version)
        if v < self.next_version:
            raise ValueError(f"tensorhub: version {v} is not above the last sent ({self.next_version - 1})")
        sd: Dict[str, torch.Tensor] = {}
        for name, t in items:
            t = materialize_full_tensor(t).detach()
            if t.device.type != "cpu" or not t.is_contiguous():
                t = t.to("cpu").contiguous()
            sd[name] = t
        canonical, aliases = _group_ties(sd, f"tensorhub publish {self.init_info.model}@{v}")
        md = {ALIASES_KEY: json.dumps(aliases, sort_keys=True)} if aliases else None
        self.release()
        self.hub_client.publish(self.init_info.model, v, canonical, metadata=md)
        self.published = v
        self.next_version = v + 1
        return v

    def load(self, version: Union[int, str], *, stage: bool = False) -> None:
        """Tells the engines to load (or, with ``stage``, prefetch) ``version``."""
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
