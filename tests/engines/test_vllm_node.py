"""Real vLLM engines (CPU) loading from the host's node agent, and falling
back when it dies.

A hub and a `tensorhub node` agent on this host; two vLLM engines whose
init_info names the agent's socket ("node"). The test publishes two
versions of a tiny Qwen2 (torch, tensorhub.torch.publish_module) and drives
both engines through start/update/finish: each version must be fetched by
the agent once, loaded by both engines from its copy (they hold nothing of
their own), and generate what transformers generates on the published
weights. Then the agent is killed and a third version published: the
engines fetch it themselves (and hold it, as without an agent), generations
still exact.

Run with tests/engines/run.sh (it sets up .venv-vllm, whose tensorhub wheel
carries the `tensorhub` command; or $TENSORHUB_BIN).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time

import pytest

vllm = pytest.importorskip("vllm", reason="needs the vLLM venv: bash tests/engines/run.sh")

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

import tensorhub  # noqa: E402
from tensorhub import node  # noqa: E402
from tensorhub.torch import publish_module  # noqa: E402

from vllm_procs import PipeClient, PipeEngine, _reference, engine_main, make_model_dir, recv  # noqa: E402

BIN = os.environ.get("TENSORHUB_BIN") or os.path.join(os.path.dirname(sys.executable), "tensorhub")


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


def test_vllm_engines_load_from_the_node_copy(tmp_path, monkeypatch):
    for k, v in _env(tmp_path).items():
        monkeypatch.setenv(k, v)
    model_dir = str(tmp_path / "tiny-qwen2")
    make_model_dir(model_dir)
    socket = f"@th-vllm-node-{os.getpid()}"
    ctx = mp.get_context("spawn")
    hub = tensorhub.serve_hub()
    agent = subprocess.Popen([BIN, "node", "--socket", socket, "--hub", hub.address, "--name", "agent"],
                             stdout=subprocess.PIPE, text=True)
    procs, trainer = [], None
    try:
        assert agent.stdout.readline().startswith("node agent "), agent.poll()
        engines = []
        for i in range(2):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=engine_main, args=(child, model_dir), daemon=True)
            p.start()
            procs.append(p)
            status, value = recv(parent, time.monotonic() + 300, f"engine{i} start")
            assert status == "ok", value
            engines.append(PipeEngine(parent, f"engine{i}", init_extra={"node": socket}))
        client = PipeClient(engines)
        client.init_weight_transfer_engine({"hub": hub.address, "timeout_s": 60.0})
        trainer = tensorhub.connect(hub.address, worker_id="trainer")
        torch.manual_seed(1234)
        model = Qwen2ForCausalLM(Qwen2Config.from_pretrained(model_dir)).float().eval()

        def update(version: int):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(version)) * 0.05)
            publish_module(trainer, "policy", version, model)
            client.start_weight_update()
            client.update_weights({"model": "policy", "version": version})
            client.finish_weight_update()
            want = _reference(model)
            for e in engines:
                assert e.call("generate") == want, f"{e.name} after version {version}"
            trainer.unpublish("policy", version)

        for version in (1, 2):
            update(version)
            st = node.status(socket)
            assert st["fetches"] == version and st["acquired"] == 2 * version, st
            assert [(c["version"], c["sessions"]) for c in st["copies"]] == [(version, 0)], st
            for e in engines:
                assert all(s["holding"] is None for s in e.call("stats")), "an engine kept a copy of its own"

        agent.kill()
        agent.wait(30)
        update(3)  # no agent: each engine fetches (and then holds) version 3
        for e in engines:
            assert [s["holding"] for s in e.call("stats")] == [["policy", 3]]
        for e in engines:
            e.call("stop")
    finally:
        if agent.poll() is None:
            agent.kill()
        if trainer is not None:
            trainer.close()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        hub.close()
