"""A real vLLM engine at tensor_parallel_size=2 (the CPU build, two worker
processes) loads a version through the tensorhub backend: each rank fetches
only its slice of every tensor (reshard.tp_rank_buffers), and the engine's
greedy generations equal transformers' on the published weights.

Run with tests/engines/run.sh (it sets up .venv-vllm).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="needs the vLLM venv: bash tests/engines/run.sh")


def test_tp2_engine_loads_each_ranks_slices(tmp_path):
    main = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_tp2_main.py")
    p = subprocess.run([sys.executable, main, str(tmp_path)], capture_output=True, text=True,
                       timeout=420)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-8000:]
    out = json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][-1])
    assert out["after"] == out["reference"], out
    assert out["after"] != out["before"]
    stats = sorted(out["stats"], key=lambda s: s["rank"])
    assert [s["rank"] for s in stats] == [0, 1]
    for s in stats:
        box = out["box_bytes"][str(s["rank"])]
        print(f"rank {s['rank']}: fetched {s['bytes']} bytes, its boxes {box}, "
              f"the whole version {out['total_bytes']}")
        assert s["slices"]
        # Its boxes plus at most the segment overhang, well under the whole.
        assert box <= s["bytes"] < out["total_bytes"], s
        assert box < 0.7 * out["total_bytes"]
