"""Deltas from Python (docs/design.md, "Deltas on slow links"): connect()'s
``deltas`` option reaches the worker, and a reader in another datacenter
that holds the previous version reads the next one through the delta its
publisher computed, bit-exact, with the figures in its FetchStats."""

from __future__ import annotations

import numpy as np
import pytest

import tensorhub


def test_a_remote_reader_holding_the_base_reads_the_next_version_as_a_delta(connect, model_name):
    rng = np.random.default_rng(7)
    v1 = {"w": rng.standard_normal(1 << 20).astype(np.float32)}  # 4 MiB
    v2 = {"w": v1["w"].copy()}
    changed = rng.choice(v2["w"].size, size=v2["w"].size // 100, replace=False)
    v2["w"][changed] += np.float32(1e-3)

    pub = connect(datacenter="dc0")
    # The reader assumes a slow wide-area link, so the delta wins; it waits
    # for the publisher's delta thread (the delta is computed once, after the
    # publish of version 2, while version 1 is still published).
    sub = connect(datacenter="dc1", deltas={"wide_area_link_bytes_per_s": 1e6, "wait": 30.0})
    pub.publish(model_name, 1, v1, chunk_bytes=1 << 20)
    got1 = {"w": np.empty_like(v1["w"])}
    assert sub.fetch(model_name, 1, into=got1) == 1
    pub.publish(model_name, 2, v2, chunk_bytes=1 << 20)

    got2 = {"w": np.empty_like(v2["w"])}
    stats = sub.fetch(model_name, 2, into=got2, return_stats=True)
    assert got2["w"].tobytes() == v2["w"].tobytes()
    assert stats.delta_base == 1, stats
    assert stats.bytes_from_delta == v2["w"].nbytes, stats
    assert stats.delta_chunks_read_whole == 0, stats
    # 1% of the elements changed: the delta is a small fraction of the version.
    assert 0 < stats.delta_wire_bytes < v2["w"].nbytes // 10, stats
    assert sum(s["delta_bytes"] for s in stats.sources) == stats.bytes_from_delta, stats.sources


def test_a_reader_that_reads_no_deltas_reads_the_version_whole(connect, model_name):
    rng = np.random.default_rng(8)
    v1 = {"w": rng.standard_normal(1 << 18).astype(np.float32)}
    v2 = {"w": v1["w"] + np.float32(0)}
    v2["w"][:100] += np.float32(1.0)
    pub = connect(datacenter="dc0")
    sub = connect(datacenter="dc1", deltas={"read": False, "wide_area_link_bytes_per_s": 1e6})
    pub.publish(model_name, 1, v1, chunk_bytes=1 << 18)
    got = {"w": np.empty_like(v1["w"])}
    sub.fetch(model_name, 1, into=got)
    pub.publish(model_name, 2, v2, chunk_bytes=1 << 18)
    stats = sub.fetch(model_name, 2, into=got, return_stats=True)
    assert got["w"].tobytes() == v2["w"].tobytes()
    assert stats.delta_base == 0 and stats.bytes_from_delta == 0, stats


@pytest.mark.parametrize("deltas,match", [
    ("yes", "deltas must be a dict"),
    ({"serve": 1}, r"deltas\['serve'\] must be a bool"),
    ({"wide_area_link_bytes_per_s": 0}, "bytes per second > 0"),
    ({"max_memory_bytes": -1}, "max_memory_bytes"),
    ({"wait": -1}, "wait"),
    ({"speed": 1}, "unknown deltas keys"),
])
def test_bad_delta_options_are_refused_before_connecting(hub, deltas, match):
    with pytest.raises(tensorhub.InvalidArgumentError, match=match):
        tensorhub.connect(hub.address, deltas=deltas)
