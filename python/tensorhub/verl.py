"""verl checkpoint engine ``"tensorhub"``.

Load it through verl's config; importing this module registers the backend
with verl's ``CheckpointEngineRegistry``::

    actor_rollout_ref.rollout.checkpoint_engine.backend=tensorhub
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=tensorhub.verl
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.tensorhub.hub=10.0.0.1:7070

How a sync maps onto TensorHub: the actor's rank 0 publishes the weights as
version ``global_steps`` of ``model`` (no copy of CPU tensors; GPU tensors are
staged to host memory); every rollout worker fetches that version from
whichever holders the hub names (the actor, and rollout workers that already
have it) and yields it to its server adapter. A rollout worker keeps holding
and serving the version until the next sync replaces it, so later readers
pull from it too. verl's process-group steps are no-ops: TensorHub needs no
group, so replicas can join or leave between syncs without a rebuild.

Engine kwargs (``engine_kwargs.tensorhub``): ``hub`` (HOST:PORT, default
``$TENSORHUB_HUB``), ``model`` ("policy"), ``secret_file``, ``labels``,
``timeout_s`` (120: deadline of a receive, waiting for the version included),
``connections`` (4).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, AsyncGenerator, Dict, Generator, List, Mapping, Optional, Tuple

import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

from .client import Client, connect
from .errors import NotFoundError, UnavailableError
from .torch import ALIASES_KEY, _group_ties

BACKEND = "tensorhub"


def _secret(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        s = f.read().strip()
    if not s:
        raise ValueError(f"tensorhub: secret_file {path!r} is empty")
    return s


class TensorHubCheckpointEngine(CheckpointEngine):
    """verl ``CheckpointEngine`` over TensorHub (see the module doc)."""

    def __init__(
        self,
        bucket_size: int = 0,
        is_master: bool = False,
        *,
        hub: Optional[str] = None,
        model: str = "policy",
        secret_file: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        timeout_s: float = 120.0,
        connections: int = 4,
        worker_name: Optional[str] = None,
    ) -> None:
        hub = hub or os.environ.get("TENSORHUB_HUB")
        if not hub or ":" not in hub:
            raise ValueError(
                "tensorhub checkpoint engine: set engine_kwargs.tensorhub.hub=HOST:PORT "
                f"(or $TENSORHUB_HUB); got {hub!r}"
            )
        if not isinstance(model, str) or not model:
            raise ValueError(f"tensorhub checkpoint engine: model must be a non-empty string, not {model!r}")
        if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise ValueError(f"tensorhub checkpoint engine: timeout_s must be > 0, not {timeout_s!r}")
        self.bucket_size = bucket_size  # unused: TensorHub chunks on its own
        self.is_master = is_master
        self.hub, self.model, self.secret_file = hub, model, secret_file
        self.labels = dict(labels or {})
        self.timeout_s, self.connections = float(timeout_s), int(connections)
        self.worker_name = worker_name
        self.rank = 0
        self.role = "rollout"
        self._client: Optional[Client] = None
        self._published: Optional[int] = None  # actor: the version it serves
        self._last_sent = 0
        self._held: Optional[Tuple[int, Dict[str, torch.Tensor]]] = None  # rollout
        self.last_stats: Dict[str, Any] = {}

    # -- topology (TensorHub needs none) ---------------------------------------

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = connect(
                self.hub, worker_id=self.worker_name, labels=self.labels,
                secret=_secret(self.secret_file),
            )
        return self._client

    def prepare(self) -> Dict[str, Any]:
        c = self.client
        return {"worker_id": c.worker_id, "data_address": c.data_address}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: List[dict]
    ) -> Tuple[Dict[str, List[Any]], Dict[str, List[Any]]]:
        actor = {"rank": list(range(actor_wg_world_size)), "role": ["actor"] * actor_wg_world_size}
        rollout = {"rank": list(range(rollout_world_size)), "role": ["rollout"] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, rank: int = 0, role: str = "rollout", **kwargs: Any) -> None:
        if role not in ("actor", "rollout"):
            raise ValueError(f"tensorhub checkpoint engine: role must be actor or rollout, not {role!r}")
        self.rank, self.role = int(rank), role

    def finalize(self) -> None:
        """After a sync: the actor withdraws its version (waiting for reads in
        flight), so the optimizer may change the weights; rollout workers keep
        serving theirs."""
        if self._published is not None and self._client is not None:
            v, self._published = self._published, None
            self._client.unpublish(self.model, v, timeout=self.timeout_s)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self._held = None

    # -- actor -------------------------------------------------------------------

    def _version(self, global_steps: Optional[int]) -> int:
        if global_steps is None:
            return self._last_sent + 1
        if isinstance(global_steps, bool) or not isinstance(global_steps, int) or global_steps < 1:
            raise ValueError(f"tensorhub: global_steps must be an integer >= 1, not {global_steps!r}")
        return global_steps

    async def send_weights(
        self, weights: Generator[Tuple[str, torch.Tensor], None, None], global_steps: Optional[int] = None
    ) -> Dict[str, float]:
        """Publishes ``weights`` as version ``global_steps`` (rank 0 only)."""
        t0 = time.monotonic()
        v = self._version(global_steps)
        sd: Dict[str, torch.Tensor] = {}
        async for name, t in _aiter(weights):  # every rank drives the collectives
            if self.rank != 0:
                continue
            t = t.detach()
            if t.device.type != "cpu" or not t.is_contiguous():
                t = t.to("cpu").contiguous()
            sd[name] = t
        if self.rank != 0:
            return {}
        if v <= self._last_sent:
            raise ValueError(f"tensorhub: global_steps {v} is not above the last sent ({self._last_sent})")
        canonical, aliases = _group_ties(sd, f"tensorhub send_weights({self.model}@{v})")
        import json

        md = {ALIASES_KEY: json.dumps(aliases, sort_keys=True)} if aliases else None
        if self._published is not None:
            self.finalize()
        await asyncio.to_thread(self.client.publish, self.model, v, canonical, metadata=md)
        self._published = v
        self._last_sent = v
        self.last_stats = {"publish_seconds": time.monotonic() - t0, "version": v}
        return {"tensorhub/publish_seconds": self.last_stats["publish_seconds"]}

    # -- rollout -----------------------------------------------------------------

    async def receive_weights(
        self, global_steps: Optional[int] = None
    ) -> AsyncGenerator[Tuple[str, torch.Tensor], None]:
        """Fetches version ``global_steps`` ("latest" if None) and yields it.

        The actor publishes concurrently with this call, so an unknown
        version is awaited (polling the hub with backoff) until the deadline.
        """
        deadline = time.monotonic() + self.timeout_s
        want: Any = "latest" if global_steps is None else self._version(global_steps)
        t0 = time.monotonic()
        info = await self._describe_when_ready(want, deadline)
        out = info.empty("torch")
        t1 = time.monotonic()
        stats = await asyncio.to_thread(
            self.client.fetch, self.model, info.version, into=out,
            timeout=max(0.001, deadline - time.monotonic()),
            connections=self.connections, return_stats=True,
        )
        old, self._held = self._held, (info.version, out)
        if old is not None and old[0] != info.version:
            await asyncio.to_thread(self.client.unpublish, self.model, old[0], self.timeout_s)
        self.last_stats = {
            "version": info.version, "wait_seconds": t1 - t0,
            "fetch_seconds": time.monotonic() - t1, "fetch": stats,
        }
        import json

        aliases = json.loads(info.metadata.get(ALIASES_KEY, "{}") or "{}")
        for name, t in out.items():
            yield name, t
        for alias, name in aliases.items():
            yield alias, out[name]

    async def _describe_when_ready(self, want: Any, deadline: float) -> Any:
        delay_s = 0.005
        last: Optional[BaseException] = None
        while True:
            try:
                info = await asyncio.to_thread(self.client.describe, self.model, want)
                if info.committed:
                    return info
                last = None
            except (NotFoundError, UnavailableError) as e:
                last = e
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"tensorhub: {self.model}@{want} was not published within {self.timeout_s}s"
                    + (f" (last answer: {last})" if last else " (not committed)")
                )
            await asyncio.sleep(min(delay_s, left))
            delay_s = min(delay_s * 2, 0.2)


async def _aiter(weights: Any) -> Any:
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item


if BACKEND not in CheckpointEngineRegistry._registry:
    CheckpointEngineRegistry.register(BACKEND)(TensorHubCheckpointEngine)
elif getattr(CheckpointEngineRegistry._registry[BACKEND], "__qualname__", None) != (
    TensorHubCheckpointEngine.__qualname__
) or CheckpointEngineRegistry._registry[BACKEND].__module__ != __name__:
    raise ValueError(
        f"verl already has a checkpoint engine named {BACKEND!r} that tensorhub did not register: "
        f"{CheckpointEngineRegistry._registry[BACKEND]}"
    )

__all__ = ["TensorHubCheckpointEngine", "BACKEND"]
