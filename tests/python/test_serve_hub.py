"""serve_hub's options beyond the address: oversubscribed_racks, the
heartbeat budget and the rebuild window after a start (rebuild_ms)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tensorhub
import tensorhub._log


def hub_lines(caplog):
    """The C++ hub's "listening" lines, as records of Python's logging."""
    tensorhub._log.flush()
    return [r.getMessage() for r in caplog.records
            if r.name == "tensorhub.native" and "hub listening on" in r.getMessage()]


def test_oversubscribed_racks_reaches_the_hub(caplog):
    # The hub logs its scheduling policy when it starts (at info level).
    tensorhub.set_log_level("info")
    try:
        with caplog.at_level("INFO", logger="tensorhub"):
            with tensorhub.serve_hub(oversubscribed_racks=True, rebuild_ms=0) as hub:
                pass
            with tensorhub.serve_hub(rebuild_ms=0) as hub2:
                pass
            lines = hub_lines(caplog)
    finally:
        tensorhub.set_log_level("warn")
    err = "\n".join(lines)
    assert f"hub listening on {hub.address}" in err
    assert len(lines) == 2, err
    # The boolean form means uplinks at 4:1 (tensorhub serve --rack-oversubscription).
    assert "rack uplinks oversubscribed 4:1: rack-aware pipelines" in lines[0], lines[0]
    assert "sources idle first within a datacenter" in lines[1], lines[1]
    assert hub2.address in lines[1]


def test_heartbeat_budget_reaches_the_hub(caplog):
    tensorhub.set_log_level("info")
    try:
        with caplog.at_level("INFO", logger="tensorhub"):
            with tensorhub.serve_hub(heartbeat_budget=7, max_lease_ms=9000, rebuild_ms=0) as hub:
                pass
            with tensorhub.serve_hub(heartbeat_budget=0, rebuild_ms=0) as hub2:
                pass
            lines = hub_lines(caplog)
    finally:
        tensorhub.set_log_level("warn")
    assert len(lines) == 2, lines
    assert hub.address in lines[0]
    assert "longer up to 9000 ms to keep heartbeats under 7/s" in lines[0], lines[0]
    assert hub2.address in lines[1]
    assert "heartbeats under" not in lines[1], lines[1]


def test_oversubscribed_hub_moves_bytes_between_racks():
    with tensorhub.serve_hub(oversubscribed_racks=True, rebuild_ms=0) as hub:
        trainer = tensorhub.connect(hub.address, labels={"datacenter": "d", "rack": "a"})
        near = tensorhub.connect(hub.address, labels={"datacenter": "d", "rack": "a"})
        far = tensorhub.connect(hub.address, labels={"datacenter": "d", "rack": "b"})
        try:
            src = {"w": np.arange(1 << 18, dtype=np.float32)}
            trainer.publish("m", 1, src)
            for reader in (near, far):
                out = {"w": np.zeros(1 << 18, dtype=np.float32)}
                assert reader.fetch("m", 1, into=out, timeout=20.0) == 1
                assert np.array_equal(out["w"], src["w"])
        finally:
            for c in (trainer, near, far):
                c.close()


def test_bad_serve_hub_options():
    with pytest.raises(tensorhub.InvalidArgumentError, match="oversubscribed_racks"):
        tensorhub.serve_hub(oversubscribed_racks="yes")  # type: ignore[arg-type]
    with pytest.raises(tensorhub.InvalidArgumentError, match="rebuild_ms"):
        tensorhub.serve_hub(rebuild_ms=-5)
    with pytest.raises(tensorhub.InvalidArgumentError, match="rebuild_ms"):
        tensorhub.serve_hub(rebuild_ms=1.5)  # type: ignore[arg-type]
    with pytest.raises(tensorhub.InvalidArgumentError, match="heartbeat_budget"):
        tensorhub.serve_hub(heartbeat_budget=-1)
    with pytest.raises(tensorhub.InvalidArgumentError, match="max_lease_ms"):
        tensorhub.serve_hub(max_lease_ms=50)


def test_unknown_model_is_unavailable_while_the_hub_rebuilds():
    # Rebuilding for a minute: "unknown" may only mean "not re-reported yet",
    # so the fetch retries until its timeout and says why.
    with tensorhub.serve_hub(rebuild_ms=60000) as hub:
        c = tensorhub.connect(hub.address)
        try:
            # By the timeout, give or take scheduling on a loaded machine.
            t0 = time.monotonic()
            with pytest.raises(tensorhub.UnavailableError, match="rebuilding its state"):
                c.fetch("never-published", 1, into={"w": np.zeros(4, np.float32)}, timeout=1.0)
            assert time.monotonic() - t0 < 1.0 + 10.0
        finally:
            c.close()
    # Without the window the same question is NOT_FOUND, final, at once: not
    # retried until the (far) timeout. Half of it tells the two apart on any
    # machine; how fast "at once" is belongs to benchmarks.
    with tensorhub.serve_hub(rebuild_ms=0) as hub:
        c = tensorhub.connect(hub.address)
        try:
            t0 = time.monotonic()
            with pytest.raises(tensorhub.NotFoundError):
                c.fetch("never-published", 1, into={"w": np.zeros(4, np.float32)}, timeout=60.0)
            assert time.monotonic() - t0 < 30.0
        finally:
            c.close()
