"""Client.fetch_slices, the explicit entry point of a partial fetch: two
trainer ranks publish row halves of numpy tensors, a reader fetches boxes
that cross both, by the explicit call and by the tuple form of
fetch(into=...), byte for byte; a fetch of slices is a fetch like any other
in its stats and in the worker's metrics."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest

import tensorhub


def _publish_halves(connect, model, full):
    trainers = [connect() for _ in range(2)]
    for r, t in enumerate(trainers):
        tensors, pieces = {}, {}
        for name, a in full.items():
            half = a.shape[0] // 2
            tensors[name] = np.ascontiguousarray(a[r * half:(r + 1) * half])
            pieces[name] = (list(a.shape), [r * half] + [0] * (a.ndim - 1))
        t.publish(model, 1, tensors, rank=r, group_size=2, pieces=pieces,
                  segment_bytes=256)
    return trainers


def _full():
    rng = np.random.default_rng(5)
    return {"w": rng.standard_normal((64, 48)).astype(np.float32),
            "b": rng.standard_normal((40,)).astype(np.float32)}


def test_fetch_slices_by_name_and_by_tuples(connect, model_name):
    full = _full()
    trainers = _publish_halves(connect, model_name, full)
    reader = connect(metrics_listen="127.0.0.1:0")
    boxes = {"w": ([16, 8], [32, 32]), "b": ([10], [20])}
    got = {n: np.zeros(ext, np.float32) for n, (_, ext) in boxes.items()}
    st = reader.fetch_slices(model_name, 1, {n: (got[n], boxes[n]) for n in got},
                             return_stats=True)
    assert st.version == 1
    assert np.array_equal(got["w"], full["w"][16:48, 8:40])
    assert np.array_equal(got["b"], full["b"][10:30])
    # Every stage is timed, and they add up to the whole call.
    assert st.total_seconds > 0
    assert sum(st.stages.values()) <= st.total_seconds + 1e-6
    assert st.sources and all(s["transport"] == "tcp" for s in st.sources)

    again = {n: np.zeros(ext, np.float32) for n, (_, ext) in boxes.items()}
    assert reader.fetch(model_name, "latest", into={n: (again[n], boxes[n]) for n in again}) == 1
    assert np.array_equal(again["w"], got["w"]) and np.array_equal(again["b"], got["b"])

    # Both calls count as fetches in the worker's metrics.
    text = urllib.request.urlopen(
        f"http://{reader.metrics_address}/metrics", timeout=30).read().decode()
    assert 'tensorhub_fetches_total{outcome="ok"} 2' in text, text
    for t in trainers:
        t.unpublish(model_name, 1)


def test_fetch_slices_refuses_what_is_not_a_slice(connect, model_name):
    full = _full()
    _publish_halves(connect, model_name, full)
    reader = connect()
    with pytest.raises(tensorhub.InvalidArgumentError):
        reader.fetch_slices(model_name, 1, {})
    with pytest.raises(tensorhub.InvalidArgumentError, match="must be"):
        reader.fetch_slices(model_name, 1, {"w": np.zeros((4, 4), np.float32)})
    out = np.full((2, 48), 7.0, np.float32)
    with pytest.raises(tensorhub.InvalidArgumentError, match="outside"):
        reader.fetch_slices(model_name, 1, {"w": (out, ([63, 0], [2, 48]))})
    assert np.all(out == 7.0)
