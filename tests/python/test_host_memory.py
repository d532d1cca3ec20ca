"""HostBuffer, the huge-page host memory of same-host reads, and
VersionInfo.empty(), which allocates a version's tensors in one."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import tensorhub
from tensorhub import host_memory

TWO_MIB = 2 << 20


def _buffer_of(arr):
    """The object at the bottom of a numpy view's chain of bases."""
    obj = arr
    while isinstance(obj, np.ndarray) and obj.base is not None:
        obj = obj.base
    return obj.obj if isinstance(obj, memoryview) else obj


def test_host_buffer_is_aligned_zeroed_and_writable():
    buf = tensorhub.HostBuffer(3 * TWO_MIB + 5)
    assert buf.nbytes == len(buf) == 3 * TWO_MIB + 5
    assert buf.address % TWO_MIB == 0
    view = np.frombuffer(buf, dtype=np.uint8)
    assert view.size == buf.nbytes and not view.any()
    view[:] = 7
    assert memoryview(buf)[buf.nbytes - 1] == 7
    mode = tensorhub.transparent_huge_page_mode()
    assert buf.huge_pages == (mode in ("always", "madvise")), mode


def test_host_buffer_refuses_zero_bytes():
    with pytest.raises(tensorhub.InvalidArgumentError, match="0 bytes"):
        tensorhub.HostBuffer(0)


def test_views_keep_the_buffer_alive():
    buf = tensorhub.HostBuffer(1 << 20)
    arr = np.frombuffer(buf, dtype=np.float32)
    arr[:] = 1.5
    del buf
    gc.collect()
    assert float(arr.sum()) == 1.5 * arr.size


def test_carve_lays_tensors_out_in_one_buffer():
    out = host_memory.carve(
        [("a", (3, 5), np.float32), ("b", (0,), np.int64), ("c", (7,), np.uint8),
         ("d", (2, 2), np.float64)])
    assert out["a"].shape == (3, 5) and out["a"].dtype == np.float32
    assert out["b"].shape == (0,)
    bufs = [_buffer_of(v) for v in out.values()]
    assert all(isinstance(b, tensorhub.HostBuffer) for b in bufs)
    assert all(b is bufs[0] for b in bufs)  # one HostBuffer under all of them
    addrs = [out[k].__array_interface__["data"][0] for k in ("a", "c", "d")]
    assert addrs == sorted(addrs)
    assert all(a % 64 == 0 for a in addrs)
    assert addrs[0] % TWO_MIB == 0
    for v in out.values():
        v[...] = 3
    assert int(out["a"].sum()) == 45


def test_carve_refuses_an_unknown_framework():
    with pytest.raises(tensorhub.InvalidArgumentError, match="framework"):
        host_memory.carve([("a", (1,), np.float32)], "jax")


def test_empty_fetches_into_one_host_buffer(connect, model_name):
    trainer, reader = connect(), connect()
    src = host_memory.carve([("w", (1000, 3), np.float32), ("b", (17,), np.int32)])
    src["w"][:] = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    src["b"][:] = -np.arange(17, dtype=np.int32)
    trainer.publish(model_name, 1, src)
    out = reader.describe(model_name, 1).empty("numpy")
    assert isinstance(_buffer_of(out["w"]), tensorhub.HostBuffer)
    assert _buffer_of(out["w"]) is _buffer_of(out["b"])
    reader.fetch(model_name, 1, into=out)
    np.testing.assert_array_equal(out["w"], src["w"])
    np.testing.assert_array_equal(out["b"], src["b"])
    trainer.unpublish(model_name, 1)


def test_empty_for_torch_holds_bf16(connect, model_name):
    torch = pytest.importorskip("torch")
    trainer, reader = connect(), connect()
    src = host_memory.carve([("w", (64, 9), torch.bfloat16), ("e", (0, 4), torch.float32)],
                            "torch")
    src["w"].copy_(torch.randn(64, 9).to(torch.bfloat16))
    trainer.publish(model_name, 1, src)
    out = reader.describe(model_name, 1).empty("torch")
    assert out["w"].dtype == torch.bfloat16 and out["e"].shape == (0, 4)
    reader.fetch(model_name, 1, into=out)
    assert torch.equal(out["w"], src["w"])
    trainer.unpublish(model_name, 1)
