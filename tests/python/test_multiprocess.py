"""A publisher process and several fetcher processes (spawned, not forked)."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np

import tensorhub

N_FETCHERS = 3


def make_weights(version: int):
    rng = np.random.default_rng(version)
    return {
        "emb": rng.standard_normal((256, 64)).astype(np.float32),
        "bias": rng.standard_normal(64).astype(np.float16),
        "steps": np.array([version], np.int64),
    }


def publisher(hub_addr, model, ready, release, versions):
    with tensorhub.connect(hub_addr, worker_id="publisher") as c:
        for v in versions:
            c.publish(model, v, make_weights(v))
        ready.set()
        release.wait(60)
        for v in versions:
            c.unpublish(model, v)


def fetcher(hub_addr, model, version, results, idx):
    try:
        with tensorhub.connect(hub_addr, worker_id=f"fetcher{idx}") as c:
            info = c.describe(model, version)
            out = info.empty("numpy")
            got = c.fetch(model, version, into=out, timeout=30)
            ok = all(out[k].tobytes() == v.tobytes() for k, v in make_weights(got).items())
            results.put((idx, got, ok, None))
    except BaseException as e:  # report, do not hang the parent
        results.put((idx, None, False, repr(e)))


def test_publisher_and_fetchers(hub, model_name):
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    results = ctx.Queue()
    pub = ctx.Process(target=publisher, args=(hub.address, model_name, ready, release, [1, 2]))
    pub.start()
    try:
        assert ready.wait(60), "publisher did not come up"
        procs = [
            ctx.Process(target=fetcher, args=(hub.address, model_name, v, results, i))
            for i, v in enumerate(["latest", 1, "latest"][:N_FETCHERS])
        ]
        for p in procs:
            p.start()
        got = sorted(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        assert [(g[1], g[2], g[3]) for g in got] == [(2, True, None), (1, True, None), (2, True, None)]
    finally:
        release.set()
        pub.join(30)
        if pub.is_alive():
            pub.kill()
    assert pub.exitcode == 0
