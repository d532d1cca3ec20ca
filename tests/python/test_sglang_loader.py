"""tensorhub.sglang.load_weights, SGLang's custom weight loader hook.

SGLang needs a GPU, so this calls the loader the way SGLang's model runner
does (``dynamic_import(load_format)(model, named_tensors)``) on a stand-in
model whose ``load_weights`` maps Hugging Face names onto fused parameters
(q/k/v into qkv_proj, tied lm_head), as SGLang's models do.
"""

import importlib

import pytest

torch = pytest.importorskip("torch")

import tensorhub  # noqa: E402
from tensorhub.torch import publish_module  # noqa: E402


class HFModel(torch.nn.Module):
    """The trainer's model, with Hugging Face names."""

    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Parameter(torch.randn(32, 8, generator=g))
        self.q_proj = torch.nn.Parameter(torch.randn(8, 8, generator=g))
        self.k_proj = torch.nn.Parameter(torch.randn(4, 8, generator=g))
        self.v_proj = torch.nn.Parameter(torch.randn(4, 8, generator=g))
        self.lm_head = self.embed  # tied


class StandInModel(torch.nn.Module):
    """Fused like an SGLang model: qkv_proj holds q, k and v."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Parameter(torch.zeros(32, 8))
        self.qkv_proj = torch.nn.Parameter(torch.zeros(16, 8))
        self.loaded = []

    def load_weights(self, weights):
        rows = {"q_proj": (0, 8), "k_proj": (8, 12), "v_proj": (12, 16)}
        with torch.no_grad():
            for name, t in weights:
                self.loaded.append(name)
                if name in rows:
                    a, b = rows[name]
                    self.qkv_proj[a:b].copy_(t)
                elif name == "embed":
                    self.embed.copy_(t)
                elif name == "lm_head":
                    pass  # tied to embed
                else:
                    raise KeyError(name)


def _sglang_call(model, named_tensors, load_format):
    # What SGLang's ModelRunner.update_weights_from_tensor does with a custom
    # load_format listed in --custom-weight-loader.
    module, fn = load_format.rsplit(".", 1)
    getattr(importlib.import_module(module), fn)(model, named_tensors)


def test_loader_fetches_and_loads_versions(hub, model_name):
    import tensorhub.sglang as ths

    trainer = tensorhub.connect(hub.address, worker_id="trainer")
    model = StandInModel()
    try:
        for v in (1, 2):
            src = HFModel(seed=v)
            publish_module(trainer, model_name, v, src)
            req = ths.request(model_name, v, hub=hub.address)
            _sglang_call(model, req, ths.LOADER)
            assert torch.equal(model.embed, src.embed)
            assert torch.equal(model.qkv_proj, torch.cat([src.q_proj, src.k_proj, src.v_proj]))
            assert "lm_head" in model.loaded  # the tied alias reached load_weights
            assert ths.last_stats["version"] == v
            trainer.unpublish(model_name, v)
            # The loader's process holds and serves v now: another reader can fetch it.
            with tensorhub.connect(hub.address) as late:
                info = late.describe(model_name, v)
                assert len(info.holders) == 1
                out = info.empty("torch")
                late.fetch(model_name, v, into=out, serve=False)
                assert torch.equal(out["q_proj"], src.q_proj)

        # "latest", through a reader group named in the request.
        req = ths.request(model_name, hub=hub.address)
        _sglang_call(model, req, ths.LOADER)
        assert ths.last_stats["version"] == 2

        # A missing version fails before load_weights: the model keeps its weights.
        before = model.qkv_proj.clone()
        model.loaded.clear()
        with pytest.raises(tensorhub.NotFoundError):
            _sglang_call(model, ths.request(model_name, 9, hub=hub.address, timeout_s=5), ths.LOADER)
        assert model.loaded == [] and torch.equal(model.qkv_proj, before)
    finally:
        ths.close()
        trainer.close()


def test_loader_misuse_is_clear(hub, model_name):
    import tensorhub.sglang as ths

    with pytest.raises(tensorhub.InvalidArgumentError, match="expects the named_tensors"):
        ths.load_weights(StandInModel(), [("w", torch.zeros(2))])
    with pytest.raises(tensorhub.InvalidArgumentError, match="no load_weights"):
        ths.load_weights(torch.nn.Linear(2, 2), ths.request(model_name, 1, hub=hub.address))
    with pytest.raises(tensorhub.InvalidArgumentError, match="version"):
        ths.request(model_name, 0)
    bad = [(ths.REQUEST_NAME, torch.tensor(list(b"not json"), dtype=torch.uint8))]
    with pytest.raises(tensorhub.InvalidArgumentError, match="malformed"):
        ths.load_weights(StandInModel(), bad)


def test_importing_tensorhub_needs_no_engine_package():
    import subprocess
    import sys

    code = ("import sys, tensorhub, tensorhub.vllm, tensorhub.sglang; "
            "bad = [m for m in ('vllm', 'verl', 'sglang') if m in sys.modules]; "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


class _Engine:
    """What tensorhub.sglang.update needs of an in-process sglang.Engine;
    update_weights_from_tensor dispatches to the loader as SGLang's model
    runner does, and refuses to run outside a weight-update session, as
    SGLang 0.5.23's scheduler does."""

    def __init__(self, model):
        self.model, self.calls, self.session = model, [], False

    def begin_weight_update(self):
        self.calls.append("begin")
        self.session = True

    def end_weight_update(self):
        self.calls.append("end")
        self.session = False

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.calls.append("update")
        if not self.session:
            return False, "update_weights_from_tensor must run between begin_weight_update() and end_weight_update()"
        _sglang_call(self.model, named_tensors, load_format)
        return True, "Success"


def test_update_opens_sglangs_weight_update_session(hub, model_name):
    import tensorhub.sglang as ths

    trainer = tensorhub.connect(hub.address, worker_id="trainer")
    engine = _Engine(StandInModel())
    try:
        src = HFModel(seed=5)
        publish_module(trainer, model_name, 1, src)
        assert ths.update(engine, model_name, 1, hub=hub.address) == (True, "Success")
        assert engine.calls == ["begin", "update", "end"]
        assert torch.equal(engine.model.embed, src.embed)
        # A failed load still closes the session.
        engine.calls.clear()
        with pytest.raises(tensorhub.NotFoundError):
            ths.update(engine, model_name, 9, hub=hub.address, timeout_s=5)
        assert engine.calls == ["begin", "update", "end"] and not engine.session
    finally:
        ths.close()
        trainer.close()


def test_http_payload_carries_the_request_by_value():
    import base64
    import io
    import pickle

    import tensorhub.sglang as ths

    named = ths.request("m", 3, hub="10.0.0.1:7070", data_listen="10.0.0.2:0")

    class Restricted(pickle.Unpickler):
        # What SGLang's SafeUnpickler lets through for a tensor pickled by value.
        ALLOWED = {("torch._utils", "_rebuild_tensor_v2"), ("torch", "ByteStorage"),
                   ("collections", "OrderedDict"), ("torch", "UntypedStorage")}

        def find_class(self, module, name):
            if (module, name) == ("torch.storage", "_load_from_bytes"):
                return lambda b: torch.load(io.BytesIO(b), weights_only=False)
            if (module, name) in self.ALLOWED:
                return super().find_class(module, name)
            raise RuntimeError(f"blocked {module}.{name}")

    got = Restricted(io.BytesIO(base64.b64decode(ths.http_payload(named)))).load()
    req = ths._parse(got)
    assert (req["model"], req["version"], req["hub"], req["data_listen"]) == (
        "m", 3, "10.0.0.1:7070", "10.0.0.2:0")
