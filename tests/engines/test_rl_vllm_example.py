"""examples/rl_vllm.py, a short run: GRPO with two real vLLM engines (CPU).

Runs the example as a user would (its own process, its own hub and engines)
for 8 steps and checks what it promises: exit code 0; every rollout generated
by the version expected and every engine's greedy probes equal to
transformers' on the trainer's weights (the example checks these and lists
failures); every update after the first staged (its fetch started in the
background), then applied without a fetch in the pause; stage, pause and
apply reported for every update, with the limits they are compared with.
How much of each stage overlapped generation (engine steps and tokens while
it ran) is reported, not required: whether the next batch is still being
generated when the trainer's step ends depends on the machine's speed (a CI
run saw 3 of 7 stages overlap no step). The reward must rise: the run
is seeded (model, prompts, vLLM's per-request sampling seeds), and the
default learning rate takes the reward from about 0.01 to above 0.8 by step 8
here; the check asks for +0.2. No assertion on speed.

Run with tests/engines/run.sh (it sets up .venv-vllm).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs the vLLM venv: bash tests/engines/run.sh")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8


def test_rl_vllm_example_short_run(tmp_path):
    out = tmp_path / "rl_vllm.json"
    cmd = [sys.executable, str(ROOT / "examples" / "rl_vllm.py"),
           "--steps", str(STEPS), "--reps", "2", "--json", str(out)]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    print("\n".join(lines[-(STEPS + 14):]))
    assert p.returncode == 0, f"exit {p.returncode}:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    res = json.loads(out.read_text())
    assert res["failures"] == []

    steps = res["steps"]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    # One step off policy: batch s comes from version s-1 (batch 1 from v1).
    assert [s["gen_version"] for s in steps] == [1] + list(range(1, STEPS))
    assert "sync" not in steps[0]
    overlapped = 0
    for s in steps[1:]:
        sync = s["sync"]
        assert sync["version"] == s["step"]
        assert sync["stage_seconds"] > 0 and s["pause_seconds"] > 0 and sync["apply_seconds"] > 0
        assert s["pause_seconds"] >= sync["apply_seconds"]
        for e in sync["per_engine"]:
            assert e["staged"] and e["fetch_seconds"] == 0.0, e  # no fetch in the pause
            assert e["stage_started_at"] <= e["stage_finished_at"]
            # Measured and reported (the table's "(steps,tok)"), not required.
            assert isinstance(e["inflight_at_stage"], int) and isinstance(e["steps_during_stage"], int), e
        assert f"({sync['steps_during_stage']},{sync['tokens_during_stage']})" in p.stdout
        overlapped += sync["steps_during_stage"] > 0
    print(f"stages that overlapped generation: {overlapped} of {len(steps) - 1}")
    for s in steps[:-1]:
        assert s["logprob_diff"] <= 1e-3

    lim = res["limits"]
    for key in ("local_load", "staged_pause", "staged_apply", "unstaged_pause",
                "unstaged_fetch", "unstaged_apply", "memcpy"):
        assert lim[f"{key}_seconds"] > 0, key
    for label in ("stage (fetch in the background)", "pause (the load call)",
                  "apply (layerwise reload)", "load from a local in-memory state_dict",
                  "not staged: pause", "memcpy of the bytes"):
        assert label in p.stdout, label

    assert res["reward_last"] >= res["reward_first"] + 0.2, (res["reward_first"], res["reward_last"])
