"""tensorhub.torch: module weights round trip, dtype rules, tied weights."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import tensorhub  # noqa: E402
from tensorhub.torch import ALIASES_KEY, fetch_module, publish_module  # noqa: E402


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=17, d=16, tie=True):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.norm = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Linear(d, d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        if tie:
            self.head.weight = self.emb.weight


def make(seed, dtype=torch.bfloat16, tie=True):
    torch.manual_seed(seed)
    return TinyLM(tie=tie).to(dtype)


def assert_same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def test_bf16_module_round_trip_with_ties(connect, model_name):
    src, dst = make(1), make(2)
    src.step.fill_(41)
    pub, sub = connect(), connect()
    published = publish_module(pub, model_name, 1, src)
    assert "head.weight" not in published and "emb.weight" in published
    info = sub.describe(model_name)
    assert json.loads(info.metadata[ALIASES_KEY]) == {"head.weight": "emb.weight"}
    assert all(t.dtype in ("BF16", "I64") for t in info.tensors)
    assert fetch_module(sub, model_name, dst) == 1
    assert_same(src, dst)
    assert dst.head.weight.data_ptr() == dst.emb.weight.data_ptr()  # still tied
    x = torch.tensor([[1, 2, 3]])
    assert torch.equal(src.head(src.emb(x)), dst.head(dst.emb(x)))


def test_tied_source_into_untied_module(connect, model_name):
    src, dst = make(3), make(4, tie=False)
    pub, sub = connect(), connect()
    publish_module(pub, model_name, 1, src)
    fetch_module(sub, model_name, dst)
    assert_same(src, dst)


def test_untied_source_into_tied_module_is_rejected(connect, model_name):
    src, dst = make(5, tie=False), make(6)
    pub, sub = connect(), connect()
    publish_module(pub, model_name, 1, src)
    with pytest.raises(tensorhub.InvalidArgumentError, match="ties 'head.weight' to 'emb.weight'"):
        fetch_module(sub, model_name, dst)


def test_tied_error_mode(connect, model_name):
    with pytest.raises(tensorhub.InvalidArgumentError, match="tied weights"):
        publish_module(connect(), model_name, 1, make(7), tied="error")


def test_dtype_mismatch_is_not_converted(connect, model_name):
    src, dst = make(8, torch.bfloat16), make(9, torch.float32)
    pub, sub = connect(), connect()
    publish_module(pub, model_name, 1, src)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(tensorhub.InvalidArgumentError, match=r"'mlp.weight' is torch.float32\[16, 16\] .* BF16"):
        fetch_module(sub, model_name, dst)
    for k, v in dst.state_dict().items():
        assert torch.equal(v, before[k])  # nothing was written


def test_missing_and_extra_names(connect, model_name):
    src = make(10)
    pub, sub = connect(), connect()
    publish_module(pub, model_name, 1, src)
    dst = torch.nn.Sequential(torch.nn.Linear(2, 2)).to(torch.bfloat16)
    with pytest.raises(tensorhub.InvalidArgumentError, match="module lacks"):
        fetch_module(sub, model_name, dst)


def test_non_contiguous_parameter(connect, model_name):
    m = make(11, torch.float32, tie=False)
    m.mlp.weight.data = m.mlp.weight.data.t()
    with pytest.raises(tensorhub.InvalidArgumentError, match="'mlp.weight' is not contiguous"):
        publish_module(connect(), model_name, 1, m)


def test_trainer_cycle_unpublish_before_step(connect, model_name):
    """Publish, fetch, unpublish, optimizer step, publish again: readers see
    each version exactly."""
    torch.manual_seed(0)
    src = TinyLM(tie=True)
    dst = TinyLM(tie=True)
    opt = torch.optim.SGD(src.parameters(), lr=0.1)
    pub, sub = connect(), connect()
    for v in (1, 2, 3):
        publish_module(pub, model_name, v, src)
        assert fetch_module(sub, model_name, dst) == v
        assert_same(src, dst)
        pub.unpublish(model_name, v)  # drains before the in-place update
        loss = src.head(src.norm(src.emb(torch.tensor([1, 2])))).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
