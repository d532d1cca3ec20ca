"""Prometheus metrics of the hub and the workers, scraped over HTTP.

Real processes where a user runs them: `tensorhub serve`, `tensorhub publish`,
`tensorhub keeper` and `tensorhub fetch` with --metrics-listen, and a Python
client fetching with metrics_listen. Every scrape is checked with `promtool
check metrics` (Debian's `prometheus` package) and parsed with the official
Python client's parser; the counters must have moved by exactly what
happened (bytes fetched == the model's bytes, one fetch per stage ...).
docs/grafana/tensorhub.json may only name metrics a real scrape has.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest

import tensorhub

parser = pytest.importorskip(
    "prometheus_client.parser",
    reason="prometheus_client is not installed (python/setup_env.sh installs it)",
)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TENSORHUB_BIN", REPO / "build" / "tools" / "tensorhub"))
DASHBOARD = REPO / "docs" / "grafana" / "tensorhub.json"
PROMTOOL = shutil.which("promtool")
STAGES = ("resolve", "schedule", "first_byte", "transfer", "verify", "register")

needs_cli = pytest.mark.skipif(
    not (BIN.is_file() and os.access(BIN, os.X_OK)),
    reason=f"CLI binary {BIN} not built (cmake --build build --target tensorhub, or set TENSORHUB_BIN)",
)


# -- helpers -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


class Scrape:
    """One scrape, checked by promtool and parsed by prometheus_client."""

    def __init__(self, address: str) -> None:
        self.text = scrape(address)
        self.check_with_promtool()
        self.families = {f.name: f for f in parser.text_string_to_metric_families(self.text)}
        self.samples: List[Tuple[str, Dict[str, str], float]] = [
            (s.name, dict(s.labels), s.value) for f in self.families.values() for s in f.samples
        ]

    def check_with_promtool(self) -> None:
        if PROMTOOL is None:
            return  # test_promtool_is_installed says so, once
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=self.text, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, f"promtool check metrics: {r.stdout}{r.stderr}\n{self.text}"

    def value(self, name: str, **labels: str) -> float:
        """The one sample named `name` whose labels include `labels`."""
        found = [v for n, l, v in self.samples if n == name and all(l.get(k) == x for k, x in labels.items())]
        assert len(found) == 1, (name, labels, found)
        return found[0]

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples named `name` whose labels include `labels`."""
        return sum(v for n, l, v in self.samples if n == name and all(l.get(k) == x for k, x in labels.items()))

    def names(self) -> set:
        return {n for n, _, _ in self.samples} | set(self.families)


def wait_for(predicate, what: str, timeout: float = 60.0):
    """Polls `predicate` until it returns a true value; fails at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"process exited early: {proc.stderr.read()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    wait_for(up, f"port {port}", timeout)


def wait_line(proc: subprocess.Popen, needle: str, timeout: float = 30.0) -> List[str]:
    lines: List[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"no line with {needle!r}: {lines} "
                         f"{proc.stderr.read() if proc.poll() is not None else ''}")


def stop(proc: subprocess.Popen, timeout: float = 60.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def write_safetensors(path: Path, tensors: Dict[str, np.ndarray]) -> int:
    """A safetensors file by its spec (8-byte header length, JSON, data); returns the data bytes."""
    dtypes = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtypes[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    return offset


def check_stats(st: tensorhub.FetchStats) -> None:
    """The stages are there and add up (no timing assertions)."""
    stages = st.stages
    assert tuple(stages) == STAGES
    assert stages["resolve"] == st.resolve_seconds
    for name, secs in stages.items():
        assert secs >= 0, (name, stages)
    assert st.total_seconds > 0
    assert sum(stages.values()) <= st.total_seconds + 1e-3, (stages, st.total_seconds)
    assert st.seconds <= st.total_seconds + 1e-6


# -- tests -----------------------------------------------------------------------


def test_promtool_is_installed():
    if PROMTOOL is None:
        pytest.skip("promtool not found (Debian package `prometheus`, scripts/install-deps.sh): "
                    "scrapes are parsed but not checked with `promtool check metrics`")


def test_embedded_hub_and_clients_export_what_happened(model_name):
    with tensorhub.serve_hub(rebuild_ms=0, lease_ms=30000, metrics_listen="127.0.0.1:0") as hub:
        assert hub.metrics_address and hub.metrics_address.startswith("127.0.0.1:")
        trainer = tensorhub.connect(hub.address, worker_id="trainer", metrics_listen="127.0.0.1:0")
        reader = tensorhub.connect(hub.address, worker_id="reader", metrics_listen="127.0.0.1:0")
        plain = tensorhub.connect(hub.address, worker_id="plain")
        try:
            assert plain.metrics_address is None
            weights = {"w": np.arange(3 << 18, dtype=np.float32), "b": np.ones(7, np.int64)}
            nbytes = sum(a.nbytes for a in weights.values())
            trainer.publish(model_name, 1, weights, chunk_bytes=1 << 20)
            out = reader.describe(model_name, 1).empty("numpy")
            st = reader.fetch(model_name, 1, into=out, return_stats=True)
            assert st.bytes == nbytes
            check_stats(st)
            for k, a in weights.items():
                assert np.array_equal(out[k], a)

            r = Scrape(reader.metrics_address)
            assert r.value("tensorhub_fetches_total", outcome="ok") == 1
            assert r.value("tensorhub_fetches_total", outcome="error") == 0
            assert r.total("tensorhub_fetched_bytes_total") == nbytes
            assert r.value("tensorhub_fetched_chunks_total") == reader.describe(model_name, 1).num_chunks
            assert r.value("tensorhub_fetch_seconds_count") == 1
            for stage in STAGES:
                assert r.value("tensorhub_fetch_stage_seconds_count", stage=stage) == 1
                assert r.value("tensorhub_fetch_stage_seconds_sum", stage=stage) == pytest.approx(
                    st.stages[stage], abs=1e-6)
            assert r.value("tensorhub_held_versions", state="complete") == 1
            assert r.value("tensorhub_held_versions", state="filling") == 0

            t = Scrape(trainer.metrics_address)
            # The trainer also served the reader the manifest (the hub named
            # it by its SHA-256): counted as served, not as fetched chunks.
            manifest = r.value("tensorhub_fetch_manifest_bytes_total")
            assert r.value("tensorhub_fetch_manifests_total", **{"from": "source"}) == 1
            assert 0 < manifest < 65536
            assert t.total("tensorhub_served_bytes_total") == nbytes + manifest
            assert t.value("tensorhub_fetches_total", outcome="ok") == 0
            # The reader copied from the trainer's memory, or got it over TCP:
            # the two ends agree on which.
            for path in ("tcp", "same_host"):
                served = t.value("tensorhub_served_bytes_total", path=path)
                fetched = r.value("tensorhub_fetched_bytes_total", path=path)
                assert served in (fetched, fetched + manifest)
            assert r.value("tensorhub_fetched_bytes_total", path="same_host") == st.bytes_same_host

            h = Scrape(hub.metrics_address)
            assert h.value("tensorhub_hub_models") >= 1
            assert h.value("tensorhub_hub_workers") == 3
            assert h.value("tensorhub_hub_versions", state="committed") >= 1
            assert h.value("tensorhub_hub_holders", state="complete") >= 2
            assert h.value("tensorhub_hub_rebuilding") == 0
            assert h.value("tensorhub_hub_rpcs_total", method="BeginFetch", code="OK") >= 1
            assert h.value("tensorhub_hub_rpc_seconds_count", method="Publish") >= 1
            assert h.value("tensorhub_hub_rpcs_total", method="Publish", code="OK") == h.value(
                "tensorhub_hub_rpc_seconds_count", method="Publish")

            # A failed fetch counts as one, with its hub error code.
            with pytest.raises(tensorhub.NotFoundError):
                reader.fetch(model_name + "-missing", "latest", into=out)
            r = Scrape(reader.metrics_address)
            assert r.value("tensorhub_fetches_total", outcome="error") == 1
            assert r.value("tensorhub_fetch_seconds_count") == 1
            h = Scrape(hub.metrics_address)
            assert h.value("tensorhub_hub_rpcs_total", method="BeginFetch", code="NOT_FOUND") == 1

            # A drain is observed once per unpublish.
            trainer.unpublish(model_name, 1)
            assert Scrape(trainer.metrics_address).value("tensorhub_unpublish_drain_seconds_count") == 1
        finally:
            for c in (trainer, reader, plain):
                c.close()


def test_a_metrics_port_in_use_is_a_clear_error(hub):
    with tensorhub.serve_hub(metrics_listen="127.0.0.1:0") as other:
        taken = other.metrics_address
        with pytest.raises(tensorhub.UnavailableError, match="in use"):
            tensorhub.connect(hub.address, metrics_listen=taken, connect_timeout=5.0)
        with pytest.raises(tensorhub.UnavailableError, match=re.escape(taken)):
            tensorhub.serve_hub(metrics_listen=taken)
    with pytest.raises(tensorhub.InvalidArgumentError, match="HOST:PORT"):
        tensorhub.connect(hub.address, metrics_listen="no-port", connect_timeout=5.0)


@pytest.fixture
def cli_cluster(tmp_path):
    """`tensorhub serve`, `tensorhub publish` of a 6 MiB file and `tensorhub
    keeper`, each with --metrics-listen. Yields (hub, file, data bytes,
    metrics addresses, the publisher's process)."""
    hub_port, hub_metrics, pub_metrics, keeper_metrics = (free_port() for _ in range(4))
    hub = f"127.0.0.1:{hub_port}"
    env = dict(os.environ, TENSORHUB_LOG="warn")
    procs: List[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        p = subprocess.Popen([str(BIN), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
        procs.append(p)
        return p

    try:
        serve = start("serve", "--listen", hub, "--rebuild-ms", "0",
                      "--metrics-listen", f"127.0.0.1:{hub_metrics}")
        wait_port(hub_port, serve)
        wait_port(hub_metrics, serve)
        rng = np.random.default_rng(7)
        src = tmp_path / "model.safetensors"
        nbytes = write_safetensors(src, {
            "embed": rng.standard_normal((1024, 1536)).astype(np.float32),
            "pos": np.arange(1000, dtype=np.int64),
        })
        pub = start("publish", str(src), "--model", "m", "--version", "1", "--hub", hub,
                    "--chunk-bytes", "1MiB", "--metrics-listen", f"127.0.0.1:{pub_metrics}")
        wait_line(pub, "serving from")
        # --leave-timeout-ms 0: at the end it holds the last reliable copy
        # of a retained version, and must not wait for another keeper.
        keeper = start("keeper", "--hub", hub, "--memory-limit", "64MiB", "--leave-timeout-ms", "0",
                       "--metrics-listen", f"127.0.0.1:{keeper_metrics}")
        wait_line(keeper, "keeper")
        yield hub, src, nbytes, {
            "hub": f"127.0.0.1:{hub_metrics}",
            "publisher": f"127.0.0.1:{pub_metrics}",
            "keeper": f"127.0.0.1:{keeper_metrics}",
        }, pub
    finally:
        for p in reversed(procs):
            assert stop(p) == 0, p.stderr.read()


@needs_cli
def test_cli_processes_export_what_happened(cli_cluster, tmp_path):
    hub, src, nbytes, addr, publisher = cli_cluster
    chunks = -(-nbytes // (1 << 20))
    before = Scrape(addr["hub"])
    assert before.value("tensorhub_hub_workers") == 2  # publisher, keeper
    assert before.value("tensorhub_hub_versions", state="committed") == 1

    # A Python worker fetches with its own endpoint (it stays up to be
    # scraped). A spot worker: the publisher stays the one reliable copy.
    reader = tensorhub.connect(hub, worker_id="reader", reliable=False,
                               metrics_listen="127.0.0.1:0")
    try:
        out = reader.describe("m", "latest").empty("numpy")
        st = reader.fetch("m", "latest", into=out, return_stats=True)
        check_stats(st)
        assert st.bytes == nbytes
        r = Scrape(reader.metrics_address)
        assert r.total("tensorhub_fetched_bytes_total") == nbytes
        assert r.value("tensorhub_fetched_chunks_total") == chunks
        for stage in STAGES:
            assert r.value("tensorhub_fetch_stage_seconds_count", stage=stage) == 1
        p = Scrape(addr["publisher"])
        # With the manifest the reader took from it (named by the hub).
        assert p.total("tensorhub_served_bytes_total") == nbytes + r.value(
            "tensorhub_fetch_manifest_bytes_total")
        assert p.value("tensorhub_held_versions", state="complete") == 1
        h = Scrape(addr["hub"])
        assert h.value("tensorhub_hub_workers") == 3
        assert h.value("tensorhub_hub_holders", state="complete") == 2
        assert h.value("tensorhub_hub_rpcs_total", method="BeginFetch", code="OK") >= (
            before.value("tensorhub_hub_rpcs_total", method="BeginFetch", code="OK") + 1)

        # The version is retained and its last reliable holder leaves: the
        # hub holds the unpublish until the keeper copied it, and both count.
        r_ret = subprocess.run([str(BIN), "retain", "m@1", "--hub", hub], capture_output=True,
                               text=True, timeout=60)
        assert r_ret.returncode == 0, r_ret.stderr
        assert stop(publisher) == 0, publisher.stderr.read()
        # The hub let the publisher go once the keeper reported its copy; the
        # keeper counts it right after that report.
        k = wait_for(lambda: (lambda s: s if s.value("tensorhub_keeper_copies_total") == 1 else None)(
            Scrape(addr["keeper"])), "the keeper's count of its copy")
        assert k.value("tensorhub_keeper_held_bytes") == nbytes
        assert k.total("tensorhub_fetched_bytes_total") == nbytes
        h = Scrape(addr["hub"])
        assert h.value("tensorhub_hub_keeper_copy_requests_total") >= 1
        assert h.value("tensorhub_hub_retained_versions") == 1
        assert h.value("tensorhub_hub_departures_waiting") == 0
        assert h.value("tensorhub_hub_rpc_seconds_count", method="KeeperPoll") >= 1

        # `tensorhub fetch` closes with the same stage breakdown.
        out_file = tmp_path / "copy.safetensors"
        f = subprocess.run([str(BIN), "fetch", "m@1", "-o", str(out_file), "--hub", hub,
                            "--metrics-listen", "127.0.0.1:0"],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, TENSORHUB_LOG="warn"))
        assert f.returncode == 0, f.stderr
        assert out_file.read_bytes() == src.read_bytes()
        m = re.search(r"stages: resolve ([0-9.]+) s, schedule ([0-9.]+) s, first byte ([0-9.]+) s, "
                      r"transfer ([0-9.]+) s, verify ([0-9.]+) s, register ([0-9.]+) s", f.stdout)
        assert m, f.stdout
        total = float(re.search(r" in ([0-9.]+) s ", f.stdout).group(1))
        stages = [float(x) for x in m.groups()]
        assert all(x >= 0 for x in stages)
        # The line's total is `seconds` (to the last verified byte), which
        # excludes register; printed to 2 and 3 decimals.
        assert sum(stages[:5]) <= total + 0.01, f.stdout

        # Every metric the dashboard names exists in a real scrape.
        scraped = p.names()  # the publisher's, scraped while it ran
        for s in (Scrape(addr["hub"]), Scrape(addr["keeper"]), Scrape(reader.metrics_address)):
            scraped |= s.names()
        used = dashboard_metric_names()
        assert used, "the dashboard names no tensorhub_ metric"
        missing = sorted(used - scraped)
        assert not missing, f"docs/grafana/tensorhub.json names metrics no scrape has: {missing}"
    finally:
        reader.close()


def dashboard_metric_names() -> set:
    board = json.loads(DASHBOARD.read_text())
    exprs: List[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "expr" and isinstance(v, str):
                    exprs.append(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(board)
    return {n for e in exprs for n in re.findall(r"\btensorhub_[a-z0-9_]+", e)}


def test_dashboard_is_valid_json_with_panels():
    board = json.loads(DASHBOARD.read_text())
    assert board["title"]
    assert len(board["panels"]) >= 8
    assert len(dashboard_metric_names()) >= 15
