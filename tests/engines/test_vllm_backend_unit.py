"""Pure logic of the vLLM backend: registration, init/update info checks."""

import pytest

pytest.importorskip("vllm", reason="needs the vLLM venv: bash tests/engines/run.sh")

import tensorhub.vllm  # noqa: E402
from tensorhub.vllm_engine import TensorHubInitInfo, TensorHubUpdateInfo  # noqa: E402
from vllm.distributed.weight_transfer import factory  # noqa: E402


def test_register_is_idempotent():
    tensorhub.vllm.register()
    tensorhub.vllm.register()  # vLLM's own register_engine would raise here
    assert "tensorhub" in factory.WeightTransferEngineFactory._registry
    assert "tensorhub" in factory.WeightTransferTrainerFactory._registry
    cls = factory.WeightTransferEngineFactory._registry["tensorhub"]()
    assert cls.__name__ == "TensorHubWeightTransferEngine"


def test_foreign_registration_is_refused():
    reg = factory.WeightTransferEngineFactory._registry
    saved = reg.pop("tensorhub", None)
    try:
        reg["tensorhub"] = lambda: object
        with pytest.raises(ValueError, match="did not register"):
            tensorhub.vllm.register()
    finally:
        reg.pop("tensorhub")
        if saved is not None:
            reg["tensorhub"] = saved


@pytest.mark.parametrize("bad, match", [
    ({"hub": "nohostport"}, "HOST:PORT"),
    ({"hub": "h:1", "timeout_s": 0}, "timeout_s"),
    ({"hub": "h:1", "connections": 0}, "connections"),
    ({"hub": "h:1", "labels": "rack1"}, "labels"),
])
def test_init_info_is_checked(bad, match):
    with pytest.raises(ValueError, match=match):
        TensorHubInitInfo(**bad)


@pytest.mark.parametrize("bad, match", [
    ({"model": ""}, "model"),
    ({"model": "m", "version": 0}, "version"),
    ({"model": "m", "version": "newest"}, "version"),
    ({"model": "m", "version": True}, "version"),
    ({"model": "m", "timeout_s": -1}, "timeout_s"),
])
def test_update_info_is_checked(bad, match):
    with pytest.raises(ValueError, match=match):
        TensorHubUpdateInfo(**bad)


def test_worker_stats_without_engines():
    assert isinstance(tensorhub.vllm.worker_stats(), list)
