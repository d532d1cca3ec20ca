"""`tensorhub publish` / `tensorhub fetch` against the reference safetensors package.

Runs the CLI binary ($TENSORHUB_BIN, default build/tools/tensorhub).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

st_numpy = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TENSORHUB_BIN", REPO / "build" / "tools" / "tensorhub"))

pytestmark = pytest.mark.skipif(
    not (BIN.is_file() and os.access(BIN, os.X_OK)),
    reason=f"CLI binary {BIN} not built (cmake --build build --target tensorhub, or set TENSORHUB_BIN)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"hub exited early: {proc.stderr.read()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("hub did not listen in time")


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


@pytest.fixture
def cli_hub():
    port = free_port()
    env = dict(os.environ, TENSORHUB_LOG="warn")
    proc = subprocess.Popen([str(BIN), "serve", "--listen", f"127.0.0.1:{port}", "--rebuild-ms", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_port(port, proc)
        yield f"127.0.0.1:{port}"
    finally:
        assert stop(proc) == 0


def run(*args, timeout=60):
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, TENSORHUB_LOG="warn"))


def test_fetch_output_is_the_published_file(cli_hub, tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "embed.weight": rng.standard_normal((64, 32)).astype(np.float32),
        "norm.weight": rng.standard_normal(32).astype(np.float16),
        "head.bias": rng.standard_normal(7).astype(np.float64),
        "positions": np.arange(100, dtype=np.int64),
        "mask": rng.integers(0, 2, (5, 5)).astype(np.bool_),
        "bytes": rng.integers(0, 256, 33, dtype=np.uint8),
        "small_ints": rng.integers(-100, 100, (3, 3), dtype=np.int8),
        "scalar": np.array(3.5, np.float32),
    }
    src = tmp_path / "model.safetensors"
    st_numpy.save_file(tensors, str(src), metadata={"format": "np", "step": "12"})

    pub = subprocess.Popen(
        [str(BIN), "publish", str(src), "--model", "m", "--version", "1", "--hub", cli_hub],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, TENSORHUB_LOG="warn"),
    )
    try:
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = pub.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "serving from" in line:
                break
        assert lines and "serving from" in lines[-1], (lines, pub.stderr.read() if pub.poll() is not None else "")

        out = tmp_path / "out.safetensors"
        r = run("fetch", "m@latest", "-o", str(out), "--hub", cli_hub)
        assert r.returncode == 0, r.stderr
        assert "fetched m@1" in r.stdout
        assert out.read_bytes() == src.read_bytes()
        loaded = st_numpy.load_file(str(out))
        assert loaded.keys() == tensors.keys()
        for k, v in tensors.items():
            assert loaded[k].dtype == v.dtype and np.array_equal(loaded[k], v), k
    finally:
        code = stop(pub)
    assert code == 0
    assert "unpublished" in pub.stdout.read()


def test_malformed_file_is_a_clear_error(cli_hub, tmp_path):
    bad = tmp_path / "bad.safetensors"
    header = b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 99]}}'
    bad.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 16)
    r = run("publish", str(bad), "--model", "m", "--version", "1", "--hub", cli_hub)
    assert r.returncode == 1
    assert r.stderr.startswith("tensorhub: INVALID_ARGUMENT"), r.stderr
    assert "w" in r.stderr

    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\xff" * 8 + b"not a header")
    r = run("publish", str(junk), "--model", "m", "--version", "1", "--hub", cli_hub)
    assert r.returncode == 1
    assert r.stderr.startswith("tensorhub: INVALID_ARGUMENT"), r.stderr


def test_fetch_unknown_model_fails_cleanly(cli_hub, tmp_path):
    r = run("fetch", "nope@latest", "-o", str(tmp_path / "x.safetensors"), "--hub", cli_hub)
    assert r.returncode == 1
    assert "NOT_FOUND" in r.stderr


def start_publisher(path, hub, version):
    pub = subprocess.Popen(
        [str(BIN), "publish", str(path), "--model", "m", "--version", str(version), "--hub", hub],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, TENSORHUB_LOG="warn"),
    )
    line = ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "serving from" not in line:
        line = pub.stdout.readline()
        if not line:
            break
    assert "serving from" in line, pub.stderr.read() if pub.poll() is not None else line
    return pub


@pytest.mark.parametrize("change", ["truncate", "rewrite"])
def test_a_file_changed_under_its_holder_is_withdrawn_and_readers_go_elsewhere(cli_hub, tmp_path, change):
    """Issue 27, finding 7: a published file truncated (every read from it failed
    while the hub kept listing it) or rewritten in place (DATA_LOSS) under its
    holder. The holder now notices, logs why, withdraws the version and exits 3;
    a reader fetches from the other holder."""
    rng = np.random.default_rng(1)
    tensors = {"w": rng.standard_normal((256, 256)).astype(np.float32)}
    src = tmp_path / "model.safetensors"
    st_numpy.save_file(tensors, str(src))
    published = src.read_bytes()
    pub = start_publisher(src, cli_hub, 1)
    # A second holder: a reader that keeps serving what it fetched.
    held = tmp_path / "held.safetensors"
    holder = subprocess.Popen(
        [str(BIN), "fetch", "m@1", "-o", str(held), "--hub", cli_hub, "--hold"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, TENSORHUB_LOG="warn"),
    )
    try:
        line = holder.stdout.readline()
        assert "fetched m@1" in line, (line, holder.stderr.read() if holder.poll() is not None else "")
        with open(src, "r+b") as f:
            if change == "truncate":
                f.truncate(len(published) // 2)
            else:
                f.seek(len(published) - 4096)
                f.write(b"\x7f" * 4096)
        code = pub.wait(timeout=30)
        err = pub.stderr.read()
        assert code == 3, err
        assert ("truncated under this holder" if change == "truncate" else "rewritten under this holder") in err, err
        assert "withdrawn" in err, err
        # Readers read the other holder, and get the published bytes.
        out = tmp_path / "out.safetensors"
        r = run("fetch", "m@1", "-o", str(out), "--hub", cli_hub)
        assert r.returncode == 0, r.stderr
        assert out.read_bytes() == published
        show = run("show", "m@1", "--hub", cli_hub)
        assert show.returncode == 0, show.stderr
    finally:
        if pub.poll() is None:
            stop(pub)
        stop(holder)
