"""tensorhub.sglang's loader against SGLang 0.5's own model classes for a
tiny Llama and a tiny Mixtral (sglang_models_main.py), on this CPU: SGLang's
package (python/setup_vllm_env.sh unpacks it with the few pure-Python
modules its model code imports into .venv-vllm/sglang-0.5.23) builds its
models at TP 1 over gloo; serving needs a GPU. The loader, run inside
SGLang's weight-update session steps, leaves every parameter (fused qkv,
gate_up, the experts' w13/w2) equal to SGLang's own load of the same
weights.

Run with tests/engines/run.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="needs the vLLM venv (its torch): bash tests/engines/run.sh")

HERE = os.path.dirname(os.path.abspath(__file__))
SGLANG = os.environ.get("TH_SGLANG_PATH") or os.path.join(
    os.path.dirname(os.path.dirname(sys.executable)), "sglang-0.5.23")


def test_loader_on_sglangs_own_llama_and_mixtral(tmp_path):
    if not os.path.isfile(os.path.join(SGLANG, ".complete")):
        pytest.fail(f"SGLang's package is not at {SGLANG}: run bash python/setup_vllm_env.sh")
    env = dict(os.environ, TENSORHUB_LOG="warn",
               PYTHONPATH=os.pathsep.join([os.path.join(SGLANG, "site"), os.path.join(SGLANG, "deps"),
                                           os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, os.path.join(HERE, "sglang_models_main.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    out = json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][-1])
    for kind, r in out.items():
        print(f"{kind}: {len(r['params'])} SGLang parameters, fetched {r['fetched']} of {r['total']} bytes")
        assert r["equal"] and r["changed"], (kind, r)
        assert r["fetched"] == r["total"]
    assert "model.layers.0.self_attn.qkv_proj.weight" in out["llama"]["params"]
    assert "model.layers.0.block_sparse_moe.experts.w13_weight" in out["mixtral"]["params"]
