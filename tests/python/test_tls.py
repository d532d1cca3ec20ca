"""TLS from Python and from the command line, on certificates made with the
openssl command: both planes over TLS, the errors a misconfigured client
gets, and the warning of a hub that anyone can reach.

The CLI tests run $TENSORHUB_BIN (default build/tools/tensorhub).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import tensorhub

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TENSORHUB_BIN", REPO / "build" / "tools" / "tensorhub"))

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is not installed")

LEAF_EXT = """basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:localhost,IP:127.0.0.1
"""


def _openssl(cwd: Path, *args: str) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def _ca(d: Path, name: str) -> None:
    _openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "3", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")


def _leaf(d: Path, name: str, ca: str) -> None:
    _openssl(d, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
    _openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "3", "-extfile", "leaf.ext")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA with a hub and a worker certificate; another CA with a rogue one."""
    d = tmp_path_factory.mktemp("pki")
    (d / "leaf.ext").write_text(LEAF_EXT)
    _ca(d, "ca")
    _ca(d, "other-ca")
    _leaf(d, "hub", "ca")
    _leaf(d, "worker", "ca")
    _leaf(d, "rogue", "other-ca")
    return d


def _worker(pki, **kw):
    opts = dict(tls_ca=pki / "ca.pem", tls_cert=pki / "worker.pem", tls_key=pki / "worker.key")
    opts.update(kw)
    return opts


@pytest.fixture
def mtls_hub(pki):
    with tensorhub.serve_hub("127.0.0.1:0", lease_ms=30000, rebuild_ms=0, tls_cert=pki / "hub.pem",
                             tls_key=pki / "hub.key", tls_client_ca=pki / "ca.pem") as h:
        yield h


def test_both_planes_over_tls_are_byte_exact(mtls_hub, pki):
    rng = np.random.default_rng(4)
    src = {"w": rng.standard_normal((256, 1024)).astype(np.float32), "b": np.arange(7, dtype=np.int64)}
    with tensorhub.connect(mtls_hub.address, **_worker(pki, data_tls=True)) as pub, \
         tensorhub.connect(mtls_hub.address, **_worker(pki, data_tls=True)) as sub:
        pub.publish("m", 1, src)
        out = {k: np.empty_like(v) for k, v in src.items()}
        stats = sub.fetch("m", "latest", into=out, return_stats=True)
        assert stats.version == 1
        assert stats.tls_connections > 0
        for k in src:
            assert out[k].tobytes() == src[k].tobytes(), k


def test_misconfigured_clients_get_errors_that_say_what_to_set(mtls_hub, pki):
    quick = dict(connect_timeout=1.5)
    with pytest.raises(tensorhub.FailedPreconditionError, match="--tls-ca"):
        tensorhub.connect(mtls_hub.address, **quick)
    with pytest.raises(tensorhub.PermissionDeniedError, match="requires a client certificate"):
        tensorhub.connect(mtls_hub.address, tls_ca=pki / "ca.pem", **quick)
    with pytest.raises(tensorhub.PermissionDeniedError, match="refused this client's certificate"):
        tensorhub.connect(mtls_hub.address, **_worker(pki, tls_cert=pki / "rogue.pem", tls_key=pki / "rogue.key"),
                          **quick)
    with pytest.raises(tensorhub.PermissionDeniedError, match="does not trust"):
        tensorhub.connect(mtls_hub.address, **_worker(pki, tls_ca=pki / "other-ca.pem"), **quick)
    with pytest.raises(tensorhub.InvalidArgumentError, match="tls_key"):
        tensorhub.connect(mtls_hub.address, **_worker(pki, tls_key=pki / "missing.key"), **quick)
    with pytest.raises(tensorhub.InvalidArgumentError, match="tls_client_ca"):
        tensorhub.serve_hub("127.0.0.1:0", tls_cert=pki / "hub.pem", tls_key=pki / "hub.key",
                            tls_client_ca=pki / "missing.pem")


# -- the command line -------------------------------------------------------

cli = pytest.mark.skipif(not (BIN.is_file() and os.access(BIN, os.X_OK)),
                         reason=f"CLI binary {BIN} not built (or set TENSORHUB_BIN)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(*args):
    return subprocess.Popen([str(BIN), "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, TENSORHUB_LOG="info"))


def _stop(proc, timeout=30.0):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return proc.returncode


def _stderr_until(proc, marker, timeout=30.0):
    """stderr lines of `proc` up to the first one containing `marker`."""
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return lines
    raise AssertionError(f"no {marker!r} in {lines}")


@cli
def test_serve_refuses_when_anyone_could_reach_it(pki):
    # Neither a secret nor TLS on a non-loopback address: no hub, and the
    # error says what it would expose and how to fix it.
    refused = _serve("--listen", f"0.0.0.0:{_free_port()}")
    try:
        _, err = refused.communicate(timeout=30)
    finally:
        if refused.poll() is None:
            refused.kill()
    assert refused.returncode == 1, err
    assert "refusing to start a hub listening on 0.0.0.0" in err
    assert "with neither a shared secret nor TLS" in err
    assert "anyone who can reach this port can register" in err
    assert "--secret-file" in err and "--tls-cert" in err and "--insecure" in err

    # --insecure: it runs, and says the same as a warning.
    exposed = _serve("--listen", f"0.0.0.0:{_free_port()}", "--insecure")
    try:
        lines = _stderr_until(exposed, "hub listening on")
    finally:
        assert _stop(exposed) == 0
    warning = "".join(lines)
    assert "with neither a shared secret nor TLS" in warning
    assert "Running anyway: --insecure was given" in warning

    guarded = _serve("--listen", f"0.0.0.0:{_free_port()}", "--tls-cert", str(pki / "hub.pem"),
                     "--tls-key", str(pki / "hub.key"), "--tls-client-ca", str(pki / "ca.pem"))
    try:
        lines = _stderr_until(guarded, "hub listening on")
    finally:
        assert _stop(guarded) == 0
    assert not any(" W" in line[:2] or line.startswith("W") for line in lines), lines
    assert "TLS with client certificates required" in lines[-1]

    local = _serve("--listen", f"127.0.0.1:{_free_port()}")
    try:
        lines = _stderr_until(local, "hub listening on")
    finally:
        assert _stop(local) == 0
    assert not any(line.startswith("W") for line in lines), lines


def _safetensors(path: Path, data: bytes) -> None:
    header = ('{"w": {"dtype": "U8", "shape": [%d], "data_offsets": [0, %d]}}' % (len(data), len(data))).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)


@cli
def test_cli_publish_and_fetch_over_tls_on_both_planes(pki, tmp_path):
    port = _free_port()
    hub = _serve("--listen", f"127.0.0.1:{port}", "--rebuild-ms", "0", "--tls-cert", str(pki / "hub.pem"),
                 "--tls-key", str(pki / "hub.key"), "--tls-client-ca", str(pki / "ca.pem"))
    tls = ["--hub", f"127.0.0.1:{port}", "--tls-ca", str(pki / "ca.pem"), "--tls-cert", str(pki / "worker.pem"),
           "--tls-key", str(pki / "worker.key"), "--data-tls"]
    env = dict(os.environ, TENSORHUB_LOG="warn")
    pub = None
    try:
        _stderr_until(hub, "hub listening on")
        src = tmp_path / "model.safetensors"
        _safetensors(src, np.random.default_rng(9).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes())
        pub = subprocess.Popen([str(BIN), "publish", str(src), "--model", "m", "--version", "1", *tls],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        lines = []
        while not lines or "serving from" not in lines[-1]:
            line = pub.stdout.readline()
            if not line:
                break
            lines.append(line)
        assert lines and "serving from" in lines[-1], (lines, pub.stderr.read() if pub.poll() is not None else "")
        out = tmp_path / "out.safetensors"
        r = subprocess.run([str(BIN), "fetch", "m@latest", "-o", str(out), *tls], capture_output=True, text=True,
                           timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        assert out.read_bytes() == src.read_bytes()
        # A fetch without --data-tls is refused by the TLS holder, saying so.
        r = subprocess.run([str(BIN), "fetch", "m@latest", "-o", str(tmp_path / "x.safetensors"), *tls[:-1],
                            "--timeout-ms", "10000"], capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 1
        assert "uses TLS on the data plane" in r.stderr, r.stderr
        # ls (a read-only view, no worker) over TLS; without TLS it says what to set.
        r = subprocess.run([str(BIN), "ls", "--json", *tls[:-1]], capture_output=True, text=True, timeout=60,
                           env=env)
        assert r.returncode == 0 and '"model": "m"' in r.stdout, r.stderr
        r = subprocess.run([str(BIN), "ls", "--hub", f"127.0.0.1:{port}", "--timeout-ms", "3000"],
                           capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 1 and "FAILED_PRECONDITION" in r.stderr and "--tls-ca" in r.stderr, r.stderr
    finally:
        if pub is not None:
            assert _stop(pub) == 0
        assert _stop(hub) == 0


def test_worker_data_server_refuses_when_anyone_could_read_it():
    with tensorhub.serve_hub("127.0.0.1:0") as hub:
        with pytest.raises(tensorhub.FailedPreconditionError, match="refusing to start a data server") as e:
            tensorhub.connect(hub.address, data_listen="0.0.0.0:0", connect_timeout=5)
        assert "--insecure" in str(e.value) and "--secret-file" in str(e.value)
        with tensorhub.connect(hub.address, data_listen="0.0.0.0:0", insecure=True, connect_timeout=5) as c:
            assert c.worker_id
    with pytest.raises(tensorhub.FailedPreconditionError, match="refusing to start a hub"):
        tensorhub.serve_hub("0.0.0.0:0")
    with tensorhub.serve_hub("0.0.0.0:0", insecure=True) as exposed:
        assert exposed.address.startswith("0.0.0.0:")
    with tensorhub.serve_hub("0.0.0.0:0", secret="s3") as guarded:
        with tensorhub.connect("127.0.0.1:" + guarded.address.rsplit(":", 1)[1], data_listen="0.0.0.0:0",
                               secret="s3", connect_timeout=5) as c:
            assert c.worker_id
