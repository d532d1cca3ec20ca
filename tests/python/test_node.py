"""One host copy per node: `tensorhub node` and tensorhub.node.

A real agent process ($TENSORHUB_BIN node) beside the session's hub; the
engines are this process (and threads of it) speaking the agent's socket
protocol through tensorhub.node, as the integrations do. Checks that the
engines of a host share one copy (one fetch, one memfd mapped by all),
bytes exact; that a newer version replaces the older only once no engine
holds it, never touching memory an engine mapped; and that engines fall
back to fetching themselves when the agent is gone: none started, killed
while they wait for its fetch (at a known point: its fetch paused after
one chunk), or refusing (it holds a newer version).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tensorhub
from tensorhub import node

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TENSORHUB_BIN", REPO / "build" / "tools" / "tensorhub"))

pytestmark = pytest.mark.skipif(
    not (BIN.is_file() and os.access(BIN, os.X_OK)),
    reason=f"CLI binary {BIN} not built (cmake --build build --target tensorhub, or set TENSORHUB_BIN)",
)

_sockets = [0]


def weights(version: int, scale: int = 1):
    rng = np.random.default_rng(version)
    return {
        "emb": rng.standard_normal((256 * scale, 64)).astype(np.float32),
        "bias": rng.standard_normal(63).astype(np.float16),  # odd size: the next tensor's alignment
        "steps": np.array([version], np.int64),
        "layer.0.w": rng.standard_normal((64, 64)).astype(np.float32),
    }


def same(copy: node.NodeCopy, want) -> bool:
    got = copy.tensors("numpy")
    return set(got) == set(want) and all(got[k].tobytes() == want[k].tobytes() for k in want)


class Agent:
    """`tensorhub node` on a socket of its own, stdout/stderr read by threads."""

    def __init__(self, hub, *extra: str) -> None:
        _sockets[0] += 1
        self.socket = f"@th-test-node-{os.getpid()}-{_sockets[0]}"
        env = dict(os.environ, TENSORHUB_LOG="info")
        self.proc = subprocess.Popen(
            [str(BIN), "node", "--socket", self.socket, "--hub", hub.address, "--name",
             f"agent{_sockets[0]}", *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.stderr: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        line = self.proc.stdout.readline()  # "node agent WORKER at SOCKET, ..."
        assert line.startswith("node agent "), (line, self.proc.poll())
        self.worker = line.split()[2]

    def _pump(self) -> None:
        for line in self.proc.stderr:
            self.stderr.put(line)

    def wait_stderr(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"the agent never said {text!r}"
            try:
                line = self.stderr.get(timeout=left)
            except queue.Empty:
                continue
            if text in line:
                return line

    def status(self):
        return node.status(self.socket)

    def wait_status(self, pred, timeout: float = 30.0):
        """Polls the agent's status (a question, not a sleep standing in for
        an event) until pred holds."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if pred(st):
                return st
            assert time.monotonic() < deadline, f"agent status never matched: {st}"
            time.sleep(0.02)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def agent(hub):
    agents = []

    def start(*extra: str) -> Agent:
        a = Agent(hub, *extra)
        agents.append(a)
        return a

    yield start
    for a in agents:
        a.stop()


def memfd_mappings(name: str):
    """This process's mappings of the agent's memfd for `name` (model@v)."""
    with open("/proc/self/maps") as f:
        return [line for line in f if f"memfd:tensorhub {name}" in line]


def test_engines_of_a_host_share_one_copy(hub, connect, model_name, agent):
    trainer = connect(worker_id="trainer")
    w = weights(1)
    trainer.publish(model_name, 1, w, chunk_bytes=16 << 10)
    a = agent()
    results = []

    def engine():
        c = node.acquire(model_name, "latest", socket=a.socket, timeout=60)
        results.append(c)

    threads = [threading.Thread(target=engine) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 4
    assert all(c.version == 1 and same(c, w) for c in results)
    st = a.status()
    assert st["fetches"] == 1 and st["acquired"] == 4, st
    assert [(c["model"], c["version"], c["sessions"]) for c in st["copies"]] == [(model_name, 1, 4)]
    assert sum(c.fetched_now for c in results) == 1
    # One memory: all four map the same memfd (one inode), none a copy of its own.
    maps = memfd_mappings(f"{model_name}@1")
    assert len(maps) == 4 and len({m.split()[4] for m in maps}) == 1, maps
    # The agent is a holder like any reader: others can fetch from it.
    info = trainer.describe(model_name, 1)
    assert a.worker in [h.worker for h in info.holders], info.holders
    # torch views as the loaders take them (bfloat16 included elsewhere: any dtype).
    torch = pytest.importorskip("torch")
    t = results[0].tensors("torch")
    assert t["emb"].dtype == torch.float32 and tuple(t["emb"].shape) == (256, 64)
    t["emb"][0, 0] = 42.0  # a loader writing in place: its page is its own
    assert results[1].tensors("numpy")["emb"][0, 0] == w["emb"][0, 0]
    for c in results:
        c.close()
    # Only the status request's own connection is left.
    a.wait_status(lambda s: s["copies"][0]["sessions"] == 0 and s["sessions"] == 1)


def test_newer_version_replaces_the_older_once_no_engine_holds_it(hub, connect, model_name, agent):
    trainer = connect(worker_id="trainer")
    w1, w2 = weights(1), weights(2)
    trainer.publish(model_name, 1, w1)
    a = agent("--replace-wait-ms", "60000")
    held = node.acquire(model_name, 1, socket=a.socket, timeout=60)
    trainer.publish(model_name, 2, w2)
    got = []
    waiter = threading.Thread(target=lambda: got.append(node.acquire(model_name, 2, socket=a.socket, timeout=60)))
    waiter.start()
    # The request for 2 waits for the session on 1; meanwhile 1 is refused.
    a.wait_status(lambda s: s["copies"] and s["copies"][0]["superseded"])
    with pytest.raises(node.NodeUnavailable, match="being replaced"):
        node.acquire(model_name, 1, socket=a.socket, timeout=10)
    assert not got
    views = held.tensors("numpy")
    held.close()
    waiter.join(120)
    assert got and got[0].version == 2 and same(got[0], w2)
    # The first engine's views of version 1 are still exactly version 1: the
    # agent never writes memory it handed out.
    assert all(views[k].tobytes() == w1[k].tobytes() for k in w1)
    st = a.status()
    assert [(c["version"], c["state"]) for c in st["copies"]] == [(2, "ready")], st
    # An engine still on version 1 fetches it itself.
    with pytest.raises(node.NodeUnavailable, match="newer than"):
        node.acquire(model_name, 1, socket=a.socket, timeout=10)
    got[0].close()


def test_staged_version_is_fetched_once_then_acquired(hub, connect, model_name, agent):
    trainer = connect(worker_id="trainer")
    w = weights(3)
    trainer.publish(model_name, 3, w)
    a = agent()
    assert node.stage(model_name, "latest", socket=a.socket) == 3
    with node.acquire(model_name, 3, socket=a.socket, timeout=60) as c:
        assert not c.fetched_now and same(c, w)
    assert a.status()["fetches"] == 1


def test_reader_group_gets_one_version(hub, connect, model_name, agent):
    trainer = connect(worker_id="trainer")
    trainer.publish(model_name, 1, weights(1))
    a = agent()
    with node.acquire(model_name, "latest", group="engine-0", step=7, socket=a.socket) as c0:
        trainer.publish(model_name, 2, weights(2))
        # Rank 1 of the same engine, same step: the version rank 0 got.
        with node.acquire(model_name, "latest", group="engine-0", step=7, socket=a.socket) as c1:
            assert c0.version == c1.version == 1


def test_engines_fall_back_when_the_agent_dies(hub, connect, model_name, agent):
    trainer = connect(worker_id="trainer")
    w = weights(1, scale=16)  # 1 MiB and more: many chunks of 64 KiB
    trainer.publish(model_name, 1, w, chunk_bytes=64 << 10)
    # No agent at all: refused at once.
    with pytest.raises(node.NodeUnavailable, match="no node agent"):
        node.acquire(model_name, 1, socket="@th-test-node-nobody", timeout=5)
    assert not node.available("@th-test-node-nobody")

    a = agent("--pause-after-chunks", "1")
    outcome = queue.Queue()

    def engine():
        try:
            with node.acquire(model_name, 1, socket=a.socket, timeout=60):
                outcome.put("acquired from a dead agent?")
        except node.NodeUnavailable as e:
            # What an integration does: fetch it itself.
            reader = connect(worker_id="fallback-engine")
            out = reader.describe(model_name, 1).empty("numpy")
            reader.fetch(model_name, 1, into=out, timeout=60)
            outcome.put(("fell back", str(e), all(out[k].tobytes() == w[k].tobytes() for k in w)))

    t = threading.Thread(target=engine)
    t.start()
    a.wait_stderr("paused after 1 chunks")  # the agent is mid-fetch for the engine
    a.kill()
    t.join(120)
    what, why, exact = outcome.get(timeout=1)
    assert what == "fell back" and exact, why
    assert "went away" in why

    # An engine that already mapped a copy keeps reading it after the agent dies.
    b = agent()
    c = node.acquire(model_name, 1, socket=b.socket, timeout=60)
    b.kill()
    assert same(c, w)
    c.close()  # the release finds no agent: nothing to do
    with pytest.raises(node.NodeUnavailable):
        node.acquire(model_name, 1, socket=b.socket, timeout=5)


def test_bad_requests_get_a_clear_error(hub, model_name, agent):
    a = agent()
    with pytest.raises(tensorhub.NotFoundError):
        node.acquire(model_name, 1, socket=a.socket, timeout=10)
    with pytest.raises(tensorhub.InvalidArgumentError):
        node.acquire(model_name, 0, socket=a.socket)
    # A malformed message ends that session only.
    import socket as s

    conn = s.socket(s.AF_UNIX, s.SOCK_STREAM)
    conn.connect("\0" + a.socket[1:])
    conn.sendall(b"\x05\x00\x00\x00{nope")
    reply = conn.recv(4096)
    assert b"INVALID_ARGUMENT" in reply
    conn.close()
    assert node.available(a.socket)
