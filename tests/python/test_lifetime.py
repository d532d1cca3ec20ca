"""The client keeps served memory alive; it lets go exactly when it may."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import tensorhub


def test_published_array_survives_del(connect, model_name):
    pub, sub = connect(), connect()
    rng = np.random.default_rng(7)
    w = rng.standard_normal(1 << 18).astype(np.float32)  # 1 MiB
    expected = w.tobytes()
    ref = weakref.ref(w)
    pub.publish(model_name, 1, {"w": w})
    del w
    gc.collect()
    assert ref() is not None, "the client must keep the published array alive"
    # Churn the allocator so freed memory would be reused and overwritten.
    junk = [np.full(1 << 18, 9.0, np.float32) for _ in range(8)]
    out = {"w": np.zeros(1 << 18, np.float32)}
    sub.fetch(model_name, into=out)
    assert out["w"].tobytes() == expected
    del junk
    pub.unpublish(model_name, 1)
    gc.collect()
    assert ref() is None, "unpublish must drop the reference"


def test_torch_tensor_survives_del(connect, model_name):
    torch = pytest.importorskip("torch")
    pub, sub = connect(), connect()
    t = torch.arange(1 << 16, dtype=torch.int64)
    expected = t.clone()
    ref = weakref.ref(t)
    pub.publish(model_name, 1, {"t": t})
    del t
    gc.collect()
    assert ref() is not None, "the client must keep the published tensor alive"
    # Churn the allocator so freed memory would be reused and overwritten.
    junk = [torch.full((1 << 16,), 9, dtype=torch.int64) for _ in range(8)]
    out = torch.zeros(1 << 16, dtype=torch.int64)
    sub.fetch(model_name, into={"t": out})
    assert torch.equal(out, expected)
    del junk
    pub.unpublish(model_name, 1)
    gc.collect()
    assert ref() is None, "unpublish must drop the reference"


def test_failed_publish_holds_nothing(connect, model_name):
    pub = connect()
    w = np.ones(3, np.float32)
    ref = weakref.ref(w)
    with pytest.raises(tensorhub.InvalidArgumentError):
        pub.publish(model_name, 1, {"w": w}, rank=2, group_size=2)
    del w
    gc.collect()
    assert ref() is None and pub.held() == {}


def test_fetched_arrays_held_until_replaced(connect, model_name):
    pub, sub, third = connect(), connect(), connect()
    pub.publish(model_name, 1, {"w": np.full(4, 1, np.int32)})
    out = {"w": np.zeros(4, np.int32)}
    ref = weakref.ref(out["w"])
    sub.fetch(model_name, into=out, serve=True)
    assert sub.held() == {(model_name, 1): 1}
    del out
    gc.collect()
    assert ref() is not None  # still served to others
    pub.unpublish(model_name, 1)
    # The third worker reads from sub's (Python-dropped) array.
    got = {"w": np.zeros(4, np.int32)}
    third.fetch(model_name, into=got, serve=False)
    assert got["w"].tolist() == [1] * 4
    assert third.held() == {}  # serve=False holds nothing

    # A new fetch into the same memory withdraws the old version first.
    pub.publish(model_name, 2, {"w": np.full(4, 2, np.int32)})
    same = {"w": ref()}
    sub.fetch(model_name, into=same)
    assert sub.held() == {(model_name, 2): 1}
    assert same["w"].tolist() == [2] * 4
    sub.unpublish(model_name, 2)
    del same
    gc.collect()
    assert ref() is None and sub.held() == {}


def test_close_drops_references(hub, model_name):
    c = tensorhub.connect(hub.address)
    w = np.ones(3, np.float32)
    ref = weakref.ref(w)
    c.publish(model_name, 1, {"w": w})
    del w
    c.close()
    gc.collect()
    assert ref() is None
