"""examples/rl_loop.py runs end to end (a few tiny steps; learning is not checked here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rl_loop.py"


def test_rl_loop_smoke():
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "3", "--prompts", "2", "--group", "4"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[-1].startswith("done: 3 steps"), r.stdout
    steps = [ln.split() for ln in lines if ln.split() and ln.split()[0].isdigit()]
    assert [int(s[0]) for s in steps] == [1, 2, 3]
