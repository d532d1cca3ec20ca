"""Processes of the verl test: actor ranks and rollout workers, each on a
test-bed host, each running verl's own worker-side code.

An actor rank builds its checkpoint engine as verl's ``ActorRolloutRefWorker``
does and runs that class's own ``update_weights``; a rollout worker builds
it as verl's ``CheckpointEngineWorker`` does and runs that class's own
``update_weights`` into a server adapter that keeps what it received. The
test process drives them through verl's ``CheckpointEngineManager``; the
calls travel over multiprocessing pipes (request: (method, args, kwargs);
reply: ("ok", value) or ("err", text)).
"""

from __future__ import annotations

import asyncio
import hashlib
import traceback
from types import SimpleNamespace
from typing import Any, Dict, List, Tuple


def actor_weights(run: int, step: int) -> Dict[str, Any]:
    """The actor's full weights after training step ``step`` of run ``run``
    (what verl's ``get_per_tensor_param`` yields), tied embeddings included."""
    import torch

    g = torch.Generator().manual_seed(1000 * run + step)
    w = {
        "model.embed_tokens.weight": torch.randn(64, 32, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(32, 32, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(48, 32, generator=g),
        "model.layers.0.input_layernorm.weight": torch.randn(32, generator=g),
        "model.norm.bias": torch.randn(32, generator=g).to(torch.bfloat16),
    }
    w["lm_head.weight"] = w["model.embed_tokens.weight"]  # tied: the same tensor
    return w


def digest(tensors: Dict[str, Any]) -> Dict[str, Tuple[str, List[int], str]]:
    return {n: (str(t.dtype), list(t.shape),
                hashlib.sha256(t.contiguous().view(-1).view(__import__("torch").uint8).numpy()
                               .tobytes()).hexdigest())
            for n, t in tensors.items()}


class _Engine:
    """What verl's actor engine offers the worker: get_per_tensor_param."""

    def __init__(self) -> None:
        self.run, self.step = 1, 0

    def get_per_tensor_param(self, **kwargs: Any):
        w = actor_weights(self.run, self.step)
        return ((n, t) for n, t in w.items()), None


class _ServerAdapter:
    """Stands in for verl's vLLM/SGLang server adapter: keeps what it got."""

    def __init__(self) -> None:
        self.received: Dict[str, Any] = {}

    async def update_weights(self, weights: Any, global_steps: Any = None, **kwargs: Any) -> None:
        self.received = {}
        async for name, t in weights:
            self.received[name] = t.clone()


def worker_main(conn: Any, netns: str, role: str, ranks: List[int], cfg: Dict[str, Any]) -> None:
    """The actor ranks or rollout workers of one test-bed host, one
    checkpoint engine each, in one process (fewer processes to start: each
    imports verl); serves calls (rank, method, args, kwargs) in order until
    "stop"."""
    try:
        from testbed_util import enter_host

        enter_host(netns)
        from verl.checkpoint_engine.base import CheckpointEngineRegistry, CheckpointEngineWorker
        from verl.utils.import_utils import import_external_libs
        from verl.workers.config import CheckpointEngineConfig
        from verl.workers.engine_workers import ActorRolloutRefWorker

        ce = CheckpointEngineConfig(**cfg)
        backend = ce.backend
        bucket_size = ce.update_weights_bucket_megabytes << 20
        engine_kwargs = ce.engine_kwargs.get(backend, {})
        import_external_libs(ce.custom_backend_module or None)
        workers = {}
        for rank in ranks:
            if role == "actor":
                engine = CheckpointEngineRegistry.new(
                    backend, is_master=(rank == 0), bucket_size=bucket_size, **engine_kwargs)
                me = SimpleNamespace(
                    config=SimpleNamespace(rollout=SimpleNamespace(checkpoint_engine=ce)),
                    actor=SimpleNamespace(engine=_Engine()), checkpoint_engine=engine)
                workers[rank] = (me, ActorRolloutRefWorker.update_weights)
            else:
                engine = CheckpointEngineRegistry.new(backend, bucket_size=bucket_size, **engine_kwargs)
                me = SimpleNamespace(checkpoint_engine=engine, server_adapter=_ServerAdapter())
                workers[rank] = (me, CheckpointEngineWorker.update_weights)
            engine.client  # joins the hub now
    except BaseException:
        conn.send(("err", traceback.format_exc()))
        return
    conn.send(("ok", None))

    def execute_checkpoint_engine(me: Any, update: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(me.checkpoint_engine, method)(*args, **kwargs)

    def update_weights(me: Any, update: Any, **kwargs: Any) -> Any:
        return asyncio.run(update(me, **kwargs))

    def set_step(me: Any, update: Any, run: int, step: int) -> None:
        me.actor.engine.run, me.actor.engine.step = run, step

    def inspect(me: Any, update: Any) -> Dict[str, Any]:
        engine = me.checkpoint_engine
        out = {"last_stats": {k: v for k, v in engine.last_stats.items() if k != "fetch"},
               "worker_id": engine.client.worker_id, "data_address": engine.client.data_address}
        fetch = engine.last_stats.get("fetch")
        if fetch is not None:
            out["fetch_bytes"] = fetch.bytes
            out["sources"] = fetch.sources
        if role == "rollout":
            out["received"] = digest(me.server_adapter.received)
        return out

    calls = {"execute_checkpoint_engine": execute_checkpoint_engine,
             "update_weights": update_weights, "set_step": set_step, "inspect": inspect}
    while True:
        if not conn.poll(600):
            break  # the test is gone
        rank, method, args, kwargs = conn.recv()
        if method == "stop":
            for me, _ in workers.values():
                me.checkpoint_engine.close()
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", calls[method](*workers[rank], *args, **kwargs)))
        except BaseException as e:  # reported to the caller
            conn.send(("err", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    for me, _ in workers.values():
        me.checkpoint_engine.close()
