"""Round trips of every supported dtype, numpy and torch."""

from __future__ import annotations

import numpy as np
import pytest

import tensorhub

NUMPY_DTYPES = [
    (np.bool_, "BOOL"), (np.uint8, "U8"), (np.int8, "I8"), (np.uint16, "U16"),
    (np.int16, "I16"), (np.float16, "F16"), (np.uint32, "U32"), (np.int32, "I32"),
    (np.float32, "F32"), (np.uint64, "U64"), (np.int64, "I64"), (np.float64, "F64"),
]


def random_array(rng, dtype, shape):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype,name", NUMPY_DTYPES, ids=[n for _, n in NUMPY_DTYPES])
def test_numpy_roundtrip(connect, model_name, dtype, name):
    rng = np.random.default_rng(1)
    pub, sub = connect(), connect()
    src = {
        "a": random_array(rng, dtype, (3, 5)),
        "scalar": random_array(rng, dtype, ()),
        "empty": random_array(rng, dtype, (0, 4)),
    }
    pub.publish(model_name, 1, src)
    info = sub.describe(model_name)
    assert {t.name: (t.dtype, t.shape) for t in info.tensors} == {
        "a": (name, (3, 5)), "scalar": (name, ()), "empty": (name, (0, 4)),
    }
    out = info.empty("numpy")
    assert sub.fetch(model_name, "latest", into=out) == 1
    for k in src:
        assert out[k].dtype == src[k].dtype
        assert out[k].tobytes() == src[k].tobytes(), k
    pub.unpublish(model_name, 1)


def test_many_tensors_and_chunks(connect, model_name):
    """Tensors larger than a chunk and many tiny ones, several streams."""
    rng = np.random.default_rng(2)
    src = {f"t{i}": rng.standard_normal(int(rng.integers(1, 50))).astype(np.float32) for i in range(200)}
    src["big"] = rng.standard_normal(300_000).astype(np.float32)  # 1.2 MB
    pub, sub = connect(), connect()
    pub.publish(model_name, 3, src, chunk_bytes=64 << 10)
    out = {k: np.empty_like(v) for k, v in src.items()}
    stats = sub.fetch(model_name, 3, into=out, connections=4, return_stats=True)
    assert stats.version == 3 and stats.bytes == sum(v.nbytes for v in src.values())
    # The publisher holds the whole version, so the hub sent the manifest's
    # SHA-256 and the publisher served the manifest itself (not in bytes).
    assert stats.manifest_source in {s["address"] for s in stats.sources}
    assert stats.manifest_bytes > 0
    assert {s["transport"] for s in stats.sources} == {"tcp"}
    for k in src:
        np.testing.assert_array_equal(out[k], src[k])


def test_reader_becomes_holder(connect, model_name):
    """A fetched copy serves the next reader even after the publisher left."""
    src = {"w": np.arange(1000, dtype=np.int32)}
    pub, r1, r2 = connect(), connect(), connect()
    pub.publish(model_name, 1, src)
    out1 = {"w": np.zeros(1000, np.int32)}
    r1.fetch(model_name, into=out1)
    pub.unpublish(model_name, 1)
    out2 = {"w": np.zeros(1000, np.int32)}
    assert r2.fetch(model_name, into=out2) == 1
    np.testing.assert_array_equal(out2["w"], src["w"])
    holders = {h.worker for h in pub.describe(model_name).holders}
    assert holders == {r1.worker_id, r2.worker_id}


def test_latest_follows_new_versions(connect, model_name):
    pub, sub = connect(), connect()
    a = {"x": np.full(4, 1.0, np.float32)}
    b = {"x": np.full(4, 2.0, np.float32)}
    pub.publish(model_name, 1, a)
    pub.publish(model_name, 5, b)
    out = {"x": np.zeros(4, np.float32)}
    assert sub.fetch(model_name, into=out) == 5
    assert out["x"].tolist() == [2.0] * 4
    assert sub.fetch(model_name, 1, into=out) == 1  # explicit older version
    assert out["x"].tolist() == [1.0] * 4
    assert [(v.version, v.state) for v in sub.versions(model_name)] == [(1, "COMMITTED"), (5, "COMMITTED")]
    assert model_name in sub.models()
    assert sub.versions("no-such-model") == []


def test_metadata(connect, model_name):
    pub, sub = connect(), connect()
    pub.publish(model_name, 1, {"x": np.zeros(2, np.uint8)}, metadata={"step": "17", "run": "abc"})
    md = sub.describe(model_name, 1).metadata
    assert md["step"] == "17" and md["run"] == "abc"


def test_numpy_bf16_needs_explicit_bitcast(connect, model_name):
    """numpy has no bfloat16: uint16 bits are BF16 only when asked."""
    torch = pytest.importorskip("torch")
    t = torch.randn(8, 3).to(torch.bfloat16)
    pub, sub = connect(), connect()
    pub.publish(model_name, 1, {"w": t})
    info = sub.describe(model_name)
    with pytest.raises(tensorhub.InvalidArgumentError, match="numpy has no BF16"):
        info.empty("numpy")
    bits = np.zeros((8, 3), np.uint16)
    with pytest.raises(tensorhub.InvalidArgumentError, match="U16.*BF16"):
        sub.fetch(model_name, into={"w": bits})
    assert sub.fetch(model_name, into={"w": bits}, allow_bitcast=True) == 1
    assert bits.tobytes() == t.view(torch.int16).numpy().tobytes()

    # And back: publish numpy uint16 bits as BF16, fetch into a bf16 tensor.
    pub2 = connect()
    pub2.publish(model_name, 2, {"w": bits}, dtypes={"w": "BF16"})
    assert sub.describe(model_name, 2).tensors[0].dtype == "BF16"
    dst = torch.zeros(8, 3, dtype=torch.bfloat16)
    sub.fetch(model_name, 2, into={"w": dst})
    assert torch.equal(dst, t)
    with pytest.raises(tensorhub.InvalidArgumentError, match="cannot reinterpret"):
        pub2.publish(model_name, 3, {"w": np.zeros(3, np.float32)}, dtypes={"w": "BF16"})


def test_torch_roundtrip_all_dtypes(connect, model_name):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.float16,
              torch.bfloat16, torch.int32, torch.float32, torch.int64, torch.float64]
    for extra in ("uint16", "uint32", "uint64"):
        if hasattr(torch, extra):
            dtypes.append(getattr(torch, extra))
    src = {}
    for dt in dtypes:
        if dt.is_floating_point:
            src[str(dt)] = torch.randn(4, 6, generator=g).to(dt)
        elif dt == torch.bool:
            src[str(dt)] = torch.randint(0, 2, (4, 6), generator=g).bool()
        else:
            src[str(dt)] = torch.randint(0, 100, (4, 6), generator=g).to(dt)
    pub, sub = connect(), connect()
    pub.publish(model_name, 1, src)
    info = sub.describe(model_name)
    assert {t.name: t.dtype for t in info.tensors}["torch.bfloat16"] == "BF16"
    out = info.empty("torch")
    assert sub.fetch(model_name, into=out) == 1
    for k, v in src.items():
        assert out[k].dtype == v.dtype and torch.equal(out[k], v), k


def test_torch_to_numpy_same_dtype(connect, model_name):
    torch = pytest.importorskip("torch")
    src = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    pub, sub = connect(), connect()
    pub.publish(model_name, 1, {"w": src})
    out = {"w": np.zeros((3, 4), np.float32)}
    sub.fetch(model_name, into=out)
    np.testing.assert_array_equal(out["w"], src.numpy())
