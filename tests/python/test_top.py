"""`tensorhub top` without a terminal: plain lines, one snapshot per
interval (or one with --once), no control sequences; SIGTERM ends it with 0;
an unreachable hub is a clear error with --once. The live view in a terminal
is tests/testbed/top_smoke.sh (tmux on the test bed).

Runs the CLI binary ($TENSORHUB_BIN, default build/tools/tensorhub) against
a `tensorhub serve` on loopback; no Python binding needed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TENSORHUB_BIN", REPO / "build" / "tools" / "tensorhub"))

pytestmark = pytest.mark.skipif(
    not (BIN.is_file() and os.access(BIN, os.X_OK)),
    reason=f"CLI binary {BIN} not built (cmake --build build --target tensorhub, or set TENSORHUB_BIN)",
)
ENV = dict(os.environ, TENSORHUB_LOG="warn")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, sig=signal.SIGINT, timeout: float = 30.0) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def read_until(proc: subprocess.Popen, want: str, timeout: float = 30.0) -> list[str]:
    """Lines of proc's stdout up to the first containing `want`."""
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if want in line:
            return lines
    raise AssertionError(f"no line with {want!r} within {timeout} s: {lines}")


@pytest.fixture
def published(tmp_path):
    """A hub on loopback and a publisher of m@1 (1 MiB), as `trainer`."""
    port = free_port()
    hub = f"127.0.0.1:{port}"
    serve = subprocess.Popen([str(BIN), "serve", "--listen", hub, "--rebuild-ms", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    pub = None
    try:
        deadline = time.monotonic() + 20
        while True:
            assert serve.poll() is None, serve.stderr.read()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "hub did not listen in time"
                time.sleep(0.05)
        n = 1 << 20
        header = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
        header += b" " * (-len(header) % 8)
        src = tmp_path / "m.safetensors"
        src.write_bytes(struct.pack("<Q", len(header)) + header + os.urandom(n))
        pub = subprocess.Popen([str(BIN), "publish", str(src), "--model", "m", "--version", "1", "--hub", hub,
                                "--name", "trainer"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        read_until(pub, "serving from")
        yield hub
    finally:
        if pub is not None:
            assert stop(pub) == 0
        assert stop(serve) == 0


def test_once_prints_one_plain_snapshot(published):
    r = subprocess.run([str(BIN), "top", "--once", "--hub", published], capture_output=True, text=True,
                       timeout=30, env=ENV)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "\x1b" not in out, repr(out)
    lines = out.splitlines()
    assert lines[0].startswith(f"tensorhub top  hub {published}  "), lines[0]
    assert sum(line.startswith("tensorhub top ") for line in lines) == 1
    assert "workers 1  models 1  fetches in flight 0" in out, out
    version = [line for line in lines if line.startswith("m@1 ")]
    assert len(version) == 1, out
    assert "COMMITTED" in version[0] and "1.0 MiB" in version[0], version[0]
    assert "1 complete, 0 filling: trainer(" in version[0], version[0]
    assert "FETCHES IN FLIGHT (0)" in out and "no finished fetch measured yet" in out, out
    assert all(len(line) <= 160 for line in lines), out  # --width's default


def test_plain_output_repeats_until_sigterm(published):
    top = subprocess.Popen([str(BIN), "top", "--hub", published, "--interval", "0.1", "--width", "60"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        first = read_until(top, "tensorhub top ")
        later = read_until(top, "tensorhub top ")  # the next snapshot's title
        assert any(line.startswith("m@1 ") for line in later), later
        assert all(len(line.rstrip("\n")) <= 60 for line in first + later), first + later
    finally:
        code = stop(top, signal.SIGTERM)
    assert code == 0, top.stderr.read()


def test_once_against_no_hub_is_an_error():
    r = subprocess.run([str(BIN), "top", "--once", "--hub", f"127.0.0.1:{free_port()}", "--timeout-ms", "500"],
                       capture_output=True, text=True, timeout=30, env=ENV)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "UNAVAILABLE" in r.stderr and "snapshot" in r.stderr, r.stderr
