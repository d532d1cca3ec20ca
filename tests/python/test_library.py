"""TensorHub behaves like a library: quiet logging through Python's `logging`,
its version and build features, nothing native loaded by a plain import (nor
by the vLLM plugin's entry point), and `tensorhub ls` / `show` that answer in
JSON without registering as workers.

The logging checks run in fresh interpreters: logging's configuration and the
C++ level are process-wide, and pytest's own capture would hide what a user
sees on stderr.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import tensorhub

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TENSORHUB_BIN", REPO / "build" / "tools" / "tensorhub"))
needs_cli = pytest.mark.skipif(not (BIN.is_file() and os.access(BIN, os.X_OK)),
                               reason=f"CLI binary {BIN} not built (or set TENSORHUB_BIN)")


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter, with TENSORHUB_LOG unset unless given."""
    e = {k: v for k, v in os.environ.items() if k != "TENSORHUB_LOG"}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=e)


ROUND_TRIP = """
import numpy as np, tensorhub
with tensorhub.serve_hub("127.0.0.1:0") as hub:
    a = tensorhub.connect(hub.address, worker_id="a")
    b = tensorhub.connect(hub.address, worker_id="b")
    a.publish("m", 1, {"w": np.ones(1 << 16, np.float32)})
    out = b.describe("m", 1).empty("numpy")
    b.fetch("m", 1, into=out)
    a.unpublish("m", 1)
    b.close(); a.close()
"""


def test_a_round_trip_prints_nothing_unless_asked():
    r = python(ROUND_TRIP)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", f"a library must not print at INFO unasked:\n{r.stderr}"


def test_native_lines_are_logging_records():
    r = python("""
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                    format="%(name)s|%(levelname)s|%(filename)s|%(lineno)d|%(message)s")
""" + ROUND_TRIP)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    native = [line.split("|") for line in r.stdout.splitlines() if line.startswith("tensorhub.native|")]
    assert native, f"no C++ line reached logging:\n{r.stdout}"
    for name, level, filename, lineno, message in native:
        assert level in ("INFO", "WARNING", "ERROR", "DEBUG") and filename.endswith(".cc") and int(lineno) > 0
        assert not re.match(r"^[DIWE]\d\d:", message), "the stderr prefix must not be in the message"


def test_debug_is_forwarded_only_when_the_logger_wants_it():
    code = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(name)s|%(levelname)s|%(message)s")
logging.getLogger("tensorhub").setLevel(logging.DEBUG)
""" + ROUND_TRIP
    r = python(code)
    assert r.returncode == 0, r.stderr
    assert "tensorhub.native|DEBUG|" in r.stdout, r.stdout


def test_tensorhub_log_asks_for_output():
    r = python(ROUND_TRIP, TENSORHUB_LOG="info")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^I\d\d:\d\d:\d\d.* tensorhub\.native \w+\.cc:\d+\] ", r.stderr, re.M), r.stderr


def test_set_log_level():
    r = python("""
import logging, sys, tensorhub
logging.basicConfig(stream=sys.stdout, format="%(name)s|%(levelname)s|%(message)s")
tensorhub.set_log_level("info")
""" + ROUND_TRIP)
    assert r.returncode == 0, r.stderr
    assert "tensorhub.native|INFO|" in r.stdout, r.stdout
    with pytest.raises(tensorhub.InvalidArgumentError):
        tensorhub.set_log_level("loud")


def test_import_loads_nothing_native():
    r = python("""
import sys, tensorhub, tensorhub.vllm, tensorhub.node, tensorhub.errors
maps = open("/proc/self/maps").read()
print("core" if "tensorhub._core" in sys.modules or "_core" in maps else "clean")
tensorhub.connect  # a lazy name: now it loads
print("core" if "tensorhub._core" in sys.modules else "clean")
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["clean", "core"], r.stdout


def test_version_and_build_features():
    info = tensorhub.build_info()
    assert re.fullmatch(r"\d+\.\d+\.\d+", info["version"])
    assert info["tls"] and info["tls_library"].startswith("OpenSSL")
    features = [f for f in ("cuda", "ucx", "tls") if info[f]]
    assert tensorhub.__version__ == info["version"] + "+" + ".".join(features)
    assert info["line"].startswith(f"tensorhub {info['version']} (")
    assert ("UCX " + info["ucx_version"]) in info["line"] if info["ucx"] else "no UCX" in info["line"]
    try:
        from importlib.metadata import version

        installed = version("tensorhub")
    except Exception:  # a source tree on PYTHONPATH: not installed
        installed = None
    if installed is not None:
        assert installed == info["version"]


@needs_cli
def test_cli_version_says_the_features():
    r = subprocess.run([str(BIN), "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert re.match(r"tensorhub \d+\.\d+\.\d+ \((CUDA [\d.]+|no CUDA), (UCX [\d.]+|no UCX), TLS OpenSSL ", line), line


def hub_rpcs(metrics_address: str, method: str) -> int:
    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read().decode()
    total = 0
    for line in text.splitlines():
        if line.startswith("tensorhub_hub_rpcs_total{") and f'method="{method}"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


@needs_cli
def test_ls_and_show_answer_in_json_without_registering():
    with tensorhub.serve_hub("127.0.0.1:0", metrics_listen="127.0.0.1:0", rebuild_ms=0) as hub:
        with tensorhub.connect(hub.address, worker_id="trainer") as t:
            w = {"layer.w": np.ones((4, 8), np.float32), "b": np.zeros(3, np.float16)}
            t.publish("policy", 3, w, metadata={"note": "hi"})
            registered = hub_rpcs(hub.metrics_address, "RegisterWorker")

            def cli(*args):
                r = subprocess.run([str(BIN), *args, "--hub", hub.address], capture_output=True, text=True,
                                   timeout=60, env=dict(os.environ, TENSORHUB_LOG="warn"))
                assert r.returncode == 0, r.stderr
                return r.stdout

            ls = json.loads(cli("ls", "--json"))
            assert ls == {"models": [{"model": "policy", "versions": [
                {"version": 3, "state": "COMMITTED", "parts_published": 1, "group_size": 1, "holders": 1,
                 "bytes": 134, "retained": False}]}]}
            show = json.loads(cli("show", "policy@latest", "--json"))
            assert show["model"] == "policy" and show["version"] == 3 and show["state"] == "COMMITTED"
            assert [(x["name"], x["dtype"], x["shape"], x["bytes"]) for x in show["tensors"]] == [
                ("layer.w", "F32", [4, 8], 128), ("b", "F16", [3], 6)]
            assert [h["worker"] for h in show["holders_listed"]] == [t.worker_id]
            assert {"key": "note", "bytes": 2} in show["metadata"]
            assert "policy" in cli("ls") and "layer.w" in cli("show", "policy@3")
            # Neither registered a worker (no lease, nothing in the hub's tables).
            assert hub_rpcs(hub.metrics_address, "RegisterWorker") == registered
            assert hub_rpcs(hub.metrics_address, "ListModels") >= 2
