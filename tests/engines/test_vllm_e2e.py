"""End to end on real vLLM engines (CPU): a hub, a trainer, two engines,
on three test-bed hosts (bench/testbed.sh's network namespaces, under
/tmp/th-testbed.lock): the hub and the trainer on h0, engine0 on h1, engine1
on h2, with a shared secret. Nobody is told its data-plane address: each
serves on the interface that routes to the hub.

For each of K updates the trainer changes its weights, publishes version v
through the tensorhub backend's trainer engine, and both engines load v
through TensorHub (the last update prefetched while the engines generate).
Their greedy generations must equal transformers' on the trainer's weights,
token for token, and the second engine must have read bytes from the first.
Then: a version that does not exist, and a hub that is down, each give a
clear error within the update's deadline while the engine keeps its weights.

Run with tests/engines/run.sh (it sets up .venv-vllm).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

vllm = pytest.importorskip("vllm", reason="needs the vLLM venv: bash tests/engines/run.sh")

import tensorhub  # noqa: E402

import testbed_util  # noqa: E402
from vllm_procs import (  # noqa: E402
    engine_main,
    hub_down_check,
    hub_main,
    make_model_dir,
    recv,
    trainer_main,
)

UPDATES = 3


def _env(tmp_path):
    env = {
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
        "TMPDIR": str(tmp_path / "tmp"),
        "TENSORHUB_LOG": "warn",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    os.makedirs(env["TMPDIR"], exist_ok=True)
    return env


def test_two_vllm_engines_follow_the_trainer(tmp_path, monkeypatch):
    if testbed_util.why_not():
        pytest.skip(testbed_util.why_not())
    for k, v in _env(tmp_path).items():
        monkeypatch.setenv(k, v)
    model_dir = str(tmp_path / "tiny-qwen2")
    make_model_dir(model_dir)
    ctx = mp.get_context("spawn")
    t_start = time.monotonic()
    procs = []
    with testbed_util.testbed("thvllm", 3, "10.91", str(tmp_path)) as tb:
        try:
            hub_conn, child = ctx.Pipe()
            p = ctx.Process(target=hub_main, args=(child, tb.names[0], tb.ips[0], tb.secret_file),
                            daemon=True)
            p.start()
            procs.append(p)
            status, hub_address = recv(hub_conn, time.monotonic() + 60, "the hub")
            assert status == "ok", hub_address
            assert hub_address.startswith(tb.ips[0] + ":"), hub_address
            _run(ctx, tb, hub_address, hub_conn, model_dir, procs, t_start)
        finally:
            for p in procs:
                p.join(20)
                if p.is_alive():
                    p.kill()
                    p.join(10)


def _run(ctx, tb, hub_address, hub_conn, model_dir, procs, t_start):
    conns = []
    for i in range(2):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=engine_main, args=(child, model_dir, tb.names[1 + i]), daemon=True)
        p.start()
        procs.append(p)
        conns.append(parent)
    # A bound, not a speed check: two engines starting at once on a loaded
    # 2-core machine have taken over 4 minutes.
    deadline = time.monotonic() + 600
    for i, c in enumerate(conns):
        status, value = recv(c, deadline, f"engine{i} start")
        assert status == "ok", f"engine{i} did not start:\n{value}"
    started_s = time.monotonic() - t_start

    res_parent, res_child = ctx.Pipe()
    trainer = ctx.Process(
        target=trainer_main,
        args=(conns, hub_address, model_dir, UPDATES, res_child, tb.names[0], tb.secret_file),
        daemon=True,
    )
    trainer.start()
    procs.append(trainer)
    status, out = recv(res_parent, time.monotonic() + 300, "the trainer")
    assert status == "ok", f"trainer failed:\n{out}"
    trainer.join(30)
    trainer_worker = out["trainer_worker"]
    engine_workers = None
    prev_reference = out["before"][0]
    for rec in out["versions"]:
        v = rec["version"]
        # Every engine generates what transformers generates on the trainer's weights.
        for i, tokens in enumerate(rec["tokens"]):
            assert tokens == rec["reference"], f"engine{i} at version {v}: {tokens} != {rec['reference']}"
        assert rec["reference"] != prev_reference, f"version {v} did not change the generations"
        prev_reference = rec["reference"]
        assert rec["weight_version"] == [str(v), str(v)]
        stats = [s[0] for s in rec["stats"]]
        assert [s["version"] for s in stats] == [v, v]
        assert all(s["holding"] == ["policy", v] for s in stats)
        engine_workers = [s["worker_id"] for s in stats]
        # Each engine serves on its own host's address, found from the route to the hub.
        assert stats[0]["data_address"].startswith(tb.ips[1] + ":"), stats[0]
        assert stats[1]["data_address"].startswith(tb.ips[2] + ":"), stats[1]
        # engine1 takes the TP slice path: its first load fetches whole
        # tensors and learns what its loaders read; later ones fetch those
        # boxes (whole tensors at TP 1).
        assert [s["slices"] for s in stats] == [False, v != 1], stats
        first, second = stats[0]["fetch"], stats[1]["fetch"]
        assert first["bytes"] > 0 and second["bytes"] == first["bytes"]
        from_first = sum(s["bytes"] for s in second["sources"] if s["worker"] == engine_workers[0])
        from_trainer = sum(s["bytes"] for s in second["sources"] if s["worker"] == trainer_worker)
        print(
            f"version {v} ({rec['mode']}): engine1 read {from_first} of {second['bytes']} bytes "
            f"from engine0, {from_trainer} from the trainer; "
            + ", ".join(
                f"engine{i} fetch {s['fetch_seconds']:.3f}s stage {s['stage_seconds']:.3f}s "
                f"wait {s['wait_seconds']:.3f}s apply {s['apply_seconds']:.3f}s "
                f"pause {s['pause_seconds']:.3f}s"
                for i, s in enumerate(stats)
            )
        )
        # Peer serving: when engine1 loads after engine0 holds v, its bytes come
        # at least partly from engine0. (Prefetched, both stage at once, and
        # the hub may give engine1 the trainer alone: reported, not asserted.)
        if rec["mode"] == "load":
            assert from_first > 0, f"version {v}: engine1 read nothing from engine0: {second['sources']}"
        if rec["mode"] == "prefetch":
            assert all(s["staged"] for s in stats)
            print(
                f"prefetch: generate while staging took "
                f"{[round(g['seconds'], 3) for g in rec['generate_while_staging']]} s; "
                f"apply call {rec['apply_call_seconds']:.3f}s"
            )
    assert len(set(engine_workers)) == 2

    # A version that does not exist.
    assert out["missing_error"] is not None and "999" in out["missing_error"], out["missing_error"]
    assert out["missing_seconds"] < 5 + 5, out["missing_seconds"]
    assert out["after_missing"] == out["versions"][-1]["reference"]

    # A hub that is down.
    hub_conn.send(("stop", ()))
    recv(hub_conn, time.monotonic() + 30, "the hub's stop")
    down = hub_down_check(conns[0])
    print(f"hub down: error after {down['seconds']:.2f}s: {down['error']}")
    assert down["error"] is not None
    assert down["seconds"] < 5 + 5
    assert down["tokens"] == out["versions"][-1]["reference"]
    print(f"engines started in {started_s:.1f}s; whole test {time.monotonic() - t_start:.1f}s")
    for c in conns:
        c.send(("stop", ()))
