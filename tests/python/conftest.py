"""Shared fixtures: one embedded hub per test session, clients per test."""

from __future__ import annotations

import os

os.environ.setdefault("TENSORHUB_LOG", "warn")  # read when _core loads

import pytest

import tensorhub


@pytest.fixture(scope="session")
def hub():
    # rebuild_ms=0: tests ask about unknown models and expect NOT_FOUND at once.
    # No test here waits for a lease to run out, and a loaded machine may
    # delay a heartbeat (every second) by seconds: the lease is generous, so
    # that no worker is dropped for being slow.
    with tensorhub.serve_hub("127.0.0.1:0", lease_ms=30000, rebuild_ms=0) as h:
        yield h


@pytest.fixture
def connect(hub):
    """connect(**kw) -> a Client of the session hub, closed after the test."""
    clients = []

    def make(**kw):
        kw.setdefault("connect_timeout", 5.0)
        c = tensorhub.connect(hub.address, **kw)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


_counter = [0]


@pytest.fixture
def model_name(request):
    """A model name no other test uses (versions must increase per model)."""
    _counter[0] += 1
    return f"{request.node.name}-{_counter[0]}"
