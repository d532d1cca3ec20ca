"""verl checkpoint engine ``"tensorhub"``.

Load it through verl's config; importing this module registers the backend
with verl's ``CheckpointEngineRegistry``::

    actor_rollout_ref.rollout.checkpoint_engine.backend=tensorhub
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=tensorhub.verl
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.tensorhub.hub=10.0.0.1:7070

How a sync maps onto TensorHub. verl's ``CheckpointEngineManager`` runs, for
every ``update_weights(global_steps)``: ``prepare`` on every actor and
rollout worker, ``build_topology``, ``init_process_group``, the actor
ranks' ``send_weights`` concurrently with the rollouts' ``receive_weights``,
then ``finalize`` everywhere.

* Every actor rank publishes its own share of the weights as one TensorHub
  version (``group_size`` = the actor world size): local shards of DTensors
  as pieces, in place, and each plain (replicated) tensor from one rank
  (:mod:`tensorhub.pieces`). The version commits when every rank has
  published; rollouts fetch it from all actor ranks at once.
* TensorHub version numbers only grow, while verl's ``global_steps`` do not:
  ``fit()`` syncs step 0 before training and again after validation, a run
  resumed from a checkpoint starts at its saved step, and a restarted
  trainer may find its hub still holding the last run's versions. So the
  version is not the step: ``prepare`` on the actor picks the next version
  above everything the hub knows of the model, ``build_topology`` hands it
  (and the last version and step sent) to every rank, and each version
  carries its ``global_steps`` in its metadata
  (``tensorhub.verl.global_steps``), which rollouts check.
* A repeated step (the same ``global_steps`` as the last sync) moves no
  bytes: the actor publishes nothing, and a rollout that holds that step's
  version yields it again (one that does not, e.g. a replica added since,
  fetches it from the rollouts that hold it).
* A rollout worker keeps holding and serving its version until the next
  sync replaces it, so later readers pull from it too. verl's
  process-group steps are otherwise no-ops: replicas can join or leave
  between syncs without a rebuild.

Engine kwargs (``engine_kwargs.tensorhub``): ``hub`` (HOST:PORT, default
``$TENSORHUB_HUB``), ``model`` ("policy"), ``timeout_s`` (120: deadline of a
receive, waiting for the version included), ``connections`` (4),
``worker_name``, and the worker settings of :mod:`tensorhub.config` by the
same names as everywhere (``secret_file``, ``data_listen``,
``advertise_host``, ``metrics_listen``, ``tls_ca``, ``tls_cert``,
``tls_key``, ``tls_server_name``, ``data_tls``, ``insecure``,
``datacenter``, ``rack``, ``host_label`` or ``labels``), each defaulting to
its ``TENSORHUB_*`` environment variable.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, AsyncGenerator, Dict, Generator, List, Mapping, Optional, Tuple

import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

from . import config as th_config
from .client import Client, connect
from .errors import InvalidArgumentError, NotFoundError, UnavailableError
from .pieces import local_share
from .torch import ALIASES_KEY

BACKEND = "tensorhub"
#: Metadata key of a version: the verl global_steps it was sent for.
STEP_KEY = "tensorhub.verl.global_steps"
_SETTINGS = ("secret_file", "data_listen", "advertise_host", "metrics_listen", "tls_ca",
             "tls_cert", "tls_key", "tls_server_name", "data_tls", "insecure", "datacenter",
             "rack", "host_label", "labels")


class TensorHubCheckpointEngine(CheckpointEngine):
    """verl ``CheckpointEngine`` over TensorHub (see the module doc)."""

    def __init__(
        self,
        bucket_size: int = 0,
        is_master: bool = False,
        *,
        hub: Optional[str] = None,
        model: str = "policy",
        timeout_s: float = 120.0,
        connections: int = 4,
        worker_name: Optional[str] = None,
        **settings: Any,
    ) -> None:
        unknown = set(settings) - set(_SETTINGS)
        if unknown:
            raise ValueError(
                f"tensorhub checkpoint engine: unknown engine_kwargs {sorted(unknown)}; known: "
                f"hub, model, timeout_s, connections, worker_name, {', '.join(_SETTINGS)}")
        if not hub and not os.environ.get(th_config.ENV["hub"]):
            raise ValueError(
                "tensorhub checkpoint engine: set engine_kwargs.tensorhub.hub=HOST:PORT "
                f"(or ${th_config.ENV['hub']}); got {hub!r}"
            )
        try:
            self.settings = th_config.worker_settings(
                {"hub": hub, **settings}, what="tensorhub checkpoint engine")
        except InvalidArgumentError as e:
            raise ValueError(str(e)) from None
        if not isinstance(model, str) or not model:
            raise ValueError(f"tensorhub checkpoint engine: model must be a non-empty string, not {model!r}")
        if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise ValueError(f"tensorhub checkpoint engine: timeout_s must be > 0, not {timeout_s!r}")
        self.bucket_size = bucket_size  # unused: TensorHub chunks on its own
        self.is_master = is_master
        self.hub, self.model = self.settings.hub, model
        self.timeout_s, self.connections = float(timeout_s), int(connections)
        self.worker_name = worker_name
        self.rank = 0
        self.role = "rollout"
        self.world_size = 1  # actor ranks publishing one version together
        self._client: Optional[Client] = None
        self._published: Optional[int] = None  # actor: the version this rank serves
        self._last: Optional[Tuple[int, int]] = None  # actor: (version, step) sent last
        # What build_topology agreed for this sync: the version a new step
        # gets, and the (version, step) sent last.
        self._plan: Dict[str, Any] = {}
        self._held: Optional[Tuple[int, int, Dict[str, torch.Tensor], Dict[str, str]]] = None
        self.last_stats: Dict[str, Any] = {}

    # -- topology ----------------------------------------------------------------

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = connect(worker_id=self.worker_name, **self.settings.connect_kwargs())
        return self._client

    def _next_free_version(self) -> int:
        known = [v.version for v in self.client.versions(self.model)]
        floor = self._last[0] + 1 if self._last else 1
        return max([floor] + [v + 1 for v in known])

    def prepare(self) -> Dict[str, Any]:
        c = self.client
        out: Dict[str, Any] = {"worker_id": c.worker_id, "data_address": c.data_address,
                               "tensorhub": {"model": self.model}}
        if self.is_master or self.role == "actor":
            out["tensorhub"].update(
                actor=True, next_version=self._next_free_version(),
                last=list(self._last) if self._last else None)
        return out

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: List[dict]
    ) -> Tuple[Dict[str, List[Any]], Dict[str, List[Any]]]:
        """verl passes the actor ranks' metadata first: every rank gets the
        version this sync publishes (the highest any actor rank proposed)
        and the (version, step) sent last, so all agree without talking."""
        actors = [m.get("tensorhub", {}) for m in metadata[:actor_wg_world_size]]
        proposals = [a["next_version"] for a in actors if a.get("next_version")]
        lasts = [tuple(a["last"]) for a in actors if a.get("last")]
        plan = {"next_version": max(proposals) if proposals else None,
                "last": list(max(lasts)) if lasts else None}
        actor = {"rank": list(range(actor_wg_world_size)), "role": ["actor"] * actor_wg_world_size,
                 "world_size": [actor_wg_world_size] * actor_wg_world_size,
                 "plan": [plan] * actor_wg_world_size}
        rollout = {"rank": list(range(rollout_world_size)), "role": ["rollout"] * rollout_world_size,
                   "world_size": [actor_wg_world_size] * rollout_world_size,
                   "plan": [plan] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, rank: int = 0, role: str = "rollout", world_size: int = 1,
                           plan: Optional[Mapping[str, Any]] = None, **kwargs: Any) -> None:
        if role not in ("actor", "rollout"):
            raise ValueError(f"tensorhub checkpoint engine: role must be actor or rollout, not {role!r}")
        self.rank, self.role = int(rank), role
        self.world_size = int(world_size)
        self._plan = dict(plan or {})

    def finalize(self) -> None:
        """After a sync: the actor withdraws its version (waiting for reads in
        flight), so the optimizer may change the weights; rollout workers keep
        serving theirs."""
        if self._published is not None and self._client is not None:
            v, self._published = self._published, None
            self._client.unpublish(self.model, v, timeout=self.timeout_s)
        self._plan = {}

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self._held = None

    # -- actor -------------------------------------------------------------------

    @staticmethod
    def _step(global_steps: Any) -> Optional[int]:
        if global_steps is None:
            return None
        if isinstance(global_steps, bool) or not isinstance(global_steps, int) or global_steps < 0:
            raise ValueError(f"tensorhub: global_steps must be an integer >= 0, not {global_steps!r}")
        return global_steps

    async def send_weights(
        self, weights: Generator[Tuple[str, torch.Tensor], None, None], global_steps: Optional[int] = None
    ) -> Dict[str, float]:
        """Publishes this rank's share of ``weights`` for ``global_steps``.

        Every actor rank iterates ``weights`` (verl's generator runs the
        FSDP collectives). A repeated step publishes nothing: the rollouts
        hold that step's version already.
        """
        t0 = time.monotonic()
        step = self._step(global_steps)
        last = self._last or (tuple(self._plan["last"]) if self._plan.get("last") else None)
        repeat = step is not None and last is not None and last[1] == step
        items = []
        async for name, t in _aiter(weights):  # every rank drives the collectives
            if not repeat:
                items.append((name, t))
        if repeat:
            self._last = last  # type: ignore[assignment]
            self.last_stats = {"version": last[0], "repeated_step": step, "publish_seconds": 0.0}
            return {"tensorhub/publish_seconds": 0.0, "tensorhub/repeated_step": 1.0}
        v = self._plan.get("next_version") or self._next_free_version()
        what = f"tensorhub send_weights({self.model}@{v}, rank {self.rank})"
        share = local_share(items, self.rank, max(self.world_size, 1), what=what)
        del items
        md = {STEP_KEY: "" if step is None else str(step)}
        if share.aliases:
            md[ALIASES_KEY] = json.dumps(share.aliases, sort_keys=True)
        if self._published is not None:
            self.finalize()
        await asyncio.to_thread(
            self.client.publish, self.model, v, share.tensors, rank=self.rank,
            group_size=max(self.world_size, 1), metadata=md, pieces=share.pieces or None)
        self._published = v
        self._last = (v, -1 if step is None else step)
        self.last_stats = {"publish_seconds": time.monotonic() - t0, "version": v,
                           "global_steps": step, "bytes": share.bytes,
                           "pieces": len(share.pieces), "gathered": len(share.gathered)}
        return {"tensorhub/publish_seconds": self.last_stats["publish_seconds"]}

    # -- rollout -----------------------------------------------------------------

    async def receive_weights(
        self, global_steps: Optional[int] = None
    ) -> AsyncGenerator[Tuple[str, torch.Tensor], None]:
        """Fetches the version sent for ``global_steps`` (the newest if None)
        and yields it. A step this worker holds already is yielded again
        without moving a byte. The actor publishes concurrently with this
        call, so the version is awaited (polling the hub with backoff) until
        the deadline."""
        deadline = time.monotonic() + self.timeout_s
        step = self._step(global_steps)
        t0 = time.monotonic()
        last = tuple(self._plan["last"]) if self._plan.get("last") else None
        if step is not None and self._held is not None and self._held[1] == step and (
                last is None or last == (self._held[0], step)):
            version, _, out, aliases = self._held
            self.last_stats = {"version": version, "global_steps": step, "repeated_step": True,
                               "wait_seconds": 0.0, "fetch_seconds": 0.0, "fetch": None}
        else:
            if step is not None and last is not None and last[1] == step:
                want: Any = last[0]  # a repeated step this worker does not hold
            else:
                want = self._plan.get("next_version") or "latest"
            info = await self._describe_when_ready(want, step, deadline)
            t1 = time.monotonic()
            out = info.empty("torch")
            stats = await asyncio.to_thread(
                self.client.fetch, self.model, info.version, into=out,
                timeout=max(0.001, deadline - time.monotonic()), connections=self.connections,
                return_stats=True)
            aliases = json.loads(info.metadata.get(ALIASES_KEY, "{}") or "{}")
            old, self._held = self._held, (info.version, _step_of(info), out, aliases)
            if old is not None and old[0] != info.version:
                await asyncio.to_thread(self.client.unpublish, self.model, old[0], self.timeout_s)
            self.last_stats = {
                "version": info.version, "global_steps": _step_of(info), "repeated_step": False,
                "wait_seconds": t1 - t0, "fetch_seconds": time.monotonic() - t1, "fetch": stats,
            }
        for name, t in out.items():
            yield name, t
        for alias, name in aliases.items():
            yield alias, out[name]

    async def _describe_when_ready(self, want: Any, step: Optional[int], deadline: float) -> Any:
        delay_s = 0.005
        last: Optional[Any] = None
        while True:
            try:
                info = await asyncio.to_thread(self.client.describe, self.model, want)
                if info.committed and (step is None or _step_of(info) == step):
                    return info
                if info.committed and want != "latest":
                    raise ValueError(
                        f"tensorhub: {self.model}@{info.version} was sent for global_steps "
                        f"{_step_of(info)}, not {step}")
                last = (f"{self.model}@{info.version} is {info.state}"
                        + ("" if info.committed else
                           f", {info.parts_published} of {info.group_size} actor ranks published"))
            except (NotFoundError, UnavailableError) as e:
                last = e
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"tensorhub: {self.model}@{want} (global_steps {step}) was not published within "
                    f"{self.timeout_s}s" + (f" (last answer: {last})" if last else "")
                )
            await asyncio.sleep(min(delay_s, left))
            delay_s = min(delay_s * 2, 0.2)


def _step_of(info: Any) -> int:
    raw = info.metadata.get(STEP_KEY, "")
    try:
        return int(raw) if raw != "" else -1
    except (TypeError, ValueError):
        return -1


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

__all__ = ["TensorHubCheckpointEngine", "BACKEND", "STEP_KEY"]
