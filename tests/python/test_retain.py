"""retain / unretain, the keeper (the `tensorhub keeper` CLI process), and
reader groups, through the Python package."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import tensorhub

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TENSORHUB_BIN", REPO / "build" / "tools" / "tensorhub"))


def weights(seed: int):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((256, 1024)).astype(np.float32),
            "b": rng.standard_normal((1024,)).astype(np.float32)}


def test_retain_flags_and_unpublish_refused_without_keeper(connect, model_name):
    trainer = connect(leave_timeout=0.2)
    src = weights(1)
    trainer.publish(model_name, 1, src)
    assert not trainer.describe(model_name, 1).retained
    trainer.retain(model_name, 1)
    assert trainer.describe(model_name, 1).retained
    assert [v.retained for v in trainer.versions(model_name)] == [True]
    # Last reliable copy, no keeper: refused after the timeout, still published.
    # By the timeout, give or take scheduling on a loaded machine (seconds).
    t0 = time.monotonic()
    with pytest.raises(tensorhub.FailedPreconditionError, match="tensorhub keeper"):
        trainer.unpublish(model_name, 1, timeout=1.0)
    assert time.monotonic() - t0 < 1.0 + 10.0
    reader = connect()
    out = reader.describe(model_name, 1).empty()
    assert reader.fetch(model_name, 1, into=out, serve=False) == 1
    np.testing.assert_array_equal(out["w"], src["w"])
    # force drops it all the same (and the version is then lost).
    trainer.unpublish(model_name, 1, timeout=5.0, force=True)
    assert trainer.describe(model_name, 1).state == "UNAVAILABLE"
    with pytest.raises(tensorhub.NotFoundError):
        trainer.unretain(model_name, 2)
    with pytest.raises(tensorhub.InvalidArgumentError):
        trainer.retain(model_name, "latest")


def test_reader_group_ranks_get_one_version(connect, model_name):
    trainer = connect()
    v1, v2 = weights(1), weights(2)
    trainer.publish(model_name, 1, v1)
    ranks = [connect() for _ in range(2)]
    outs = [r.describe(model_name, 1).empty() for r in ranks]
    assert ranks[0].fetch(model_name, "latest", into=outs[0], serve=False,
                          group="inst-0", step=5) == 1
    trainer.publish(model_name, 2, v2)  # commits between the ranks' fetches
    assert ranks[1].fetch(model_name, "latest", into=outs[1], serve=False,
                          group="inst-0", step=5) == 1
    np.testing.assert_array_equal(outs[1]["w"], v1["w"])
    assert ranks[1].describe(model_name, group="inst-0", step=5).version == 1
    assert ranks[1].describe(model_name, group="inst-0", step=6).version == 2
    with pytest.raises(tensorhub.InvalidArgumentError):
        ranks[0].fetch(model_name, "latest", into=outs[0], step=5)
    with pytest.raises(tensorhub.InvalidArgumentError):
        ranks[0].fetch(model_name, "latest", into=outs[0], group="")


@pytest.mark.skipif(not (BIN.is_file() and os.access(BIN, os.X_OK)),
                    reason=f"CLI binary {BIN} not built")
def test_keeper_process_keeps_a_retained_version(hub, connect, model_name):
    keeper = subprocess.Popen(
        [str(BIN), "keeper", "--hub", hub.address, "--memory-limit", "64MiB",
         "--leave-timeout-ms", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = keeper.stdout.readline()
        assert line.startswith("keeper "), line + keeper.stderr.read()
        trainer = connect()
        src = weights(3)
        trainer.publish(model_name, 1, src)
        trainer.retain(model_name, 1)
        trainer.unpublish(model_name, 1, timeout=20.0)  # waits for the keeper's copy
        src["w"][:] = 0  # the trainer's memory is free again
        reader = connect()
        info = reader.describe(model_name, 1)
        assert info.state == "COMMITTED" and info.retained
        out = info.empty()
        assert reader.fetch(model_name, 1, into=out, serve=False) == 1
        np.testing.assert_array_equal(out["w"], weights(3)["w"])
    finally:
        keeper.send_signal(signal.SIGINT)
        assert keeper.wait(30) == 0
