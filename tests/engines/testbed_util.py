"""Test-bed hosts for the engine tests: bench/testbed.sh's network
namespaces, under the shared lock, and a way for a spawned test process to
move into one of them.

A process enters a host with :func:`enter_host` as the first thing it does
(before it starts a thread or opens a socket): ``setns(2)`` moves the
calling thread, and every thread and process it starts later inherits the
namespace. The pipes to the test process stay as they are.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import secrets
import shutil
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOCK = "/tmp/th-testbed.lock"
_CLONE_NEWNET = 0x40000000


@dataclass
class Testbed:
    prefix: str
    names: List[str]  # network namespaces, host i = names[i]
    ips: List[str]
    secret_file: str


def why_not() -> str:
    """Why the test bed cannot run here ("" when it can)."""
    if os.geteuid() != 0:
        return "the test bed needs root (network namespaces)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the test bed needs iproute2 (ip, tc): bash scripts/install-deps.sh"
    return ""


@contextmanager
def testbed(prefix: str, hosts: int, net: str, tmp_path: str,
            lock_timeout_s: float = 900.0) -> Iterator[Testbed]:
    """Brings up ``hosts`` test-bed hosts (1 Gbit/s links) on subnet ``net``
    (10.X) under /tmp/th-testbed.lock, with a fresh shared secret in a file,
    and takes them down afterwards."""
    lock = open(LOCK, "a+")
    deadline = time.monotonic() + lock_timeout_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                lock.close()
                raise TimeoutError(f"{LOCK} stayed held for {lock_timeout_s}s (another test bed)")
            time.sleep(0.5)
    script = os.path.join(ROOT, "bench", "testbed.sh")
    try:
        subprocess.run(["bash", script, "up", "--prefix", prefix, "--net", net, "--hosts",
                        str(hosts), "--host-mbit", "1000", "--force"], check=True,
                       stdout=subprocess.DEVNULL, timeout=120)
        env = {}
        with open(f"/run/tensorhub-testbed-{prefix}.env") as f:
            for line in f:
                if "=" in line and not line.startswith("#"):
                    k, v = line.rstrip("\n").split("=", 1)
                    env[k] = v.strip('"')
        secret_file = os.path.join(tmp_path, "tensorhub.secret")
        with open(secret_file, "w") as f:
            f.write(secrets.token_hex(16) + "\n")
        yield Testbed(prefix, env["TB_HOST_NAMES"].split(), env["TB_HOST_IPS"].split(),
                      secret_file)
    finally:
        subprocess.run(["bash", script, "down", "--prefix", prefix],
                       stdout=subprocess.DEVNULL, timeout=120)
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def enter_host(netns: str) -> None:
    """Moves this process (its calling thread: call it first) into the
    network namespace ``netns``."""
    if not netns:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({netns}): {os.strerror(err)}")
    finally:
        os.close(fd)
