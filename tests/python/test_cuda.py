"""Device memory from Python: the tuple plumbing everywhere, torch CUDA
tensors where a GPU is visible (skipped otherwise, with the reason)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tensorhub  # noqa: E402
from tensorhub import _tensors  # noqa: E402
from tensorhub.torch import fetch_module, publish_module  # noqa: E402

HAVE_CUDA = bool(torch.cuda.is_available())
needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device: torch.cuda.is_available() is False")


def test_host_tensors_carry_device_minus_one():
    t = _tensors.to_tuple("w", torch.zeros(4, dtype=torch.float32), writable=False)
    assert t[5] == -1
    assert t[4] == 16


def test_meta_tensors_are_refused_with_the_reason():
    with pytest.raises(tensorhub.InvalidArgumentError, match="host and CUDA memory only"):
        _tensors.to_tuple("w", torch.zeros(4, device="meta"), writable=False)


@needs_cuda
def test_cuda_tensor_round_trip_between_clients(connect, model_name):
    pub, sub = connect(), connect()
    src = {"w": torch.arange(1 << 20, dtype=torch.float32, device="cuda").mul_(3),
           "b": torch.arange(513, dtype=torch.bfloat16, device="cuda")}
    pub.publish(model_name, 1, src)
    into = {"w": torch.empty(1 << 20, dtype=torch.float32, device="cuda"),
            "b": torch.empty(513, dtype=torch.bfloat16, device="cuda")}
    assert sub.fetch(model_name, 1, into=into) == 1
    assert torch.equal(into["w"], src["w"]) and torch.equal(into["b"], src["b"])
    host = {"w": torch.empty(1 << 20, dtype=torch.float32), "b": torch.empty(513, dtype=torch.bfloat16)}
    assert connect().fetch(model_name, 1, into=host, serve=False) == 1
    assert torch.equal(host["w"], src["w"].cpu())


@needs_cuda
def test_cuda_module_publish_and_fetch(connect, model_name):
    torch.manual_seed(1)
    a = torch.nn.Linear(64, 64).cuda()
    b = torch.nn.Linear(64, 64).cuda()
    publish_module(connect(), model_name, 1, a)
    assert fetch_module(connect(), model_name, b) == 1
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
