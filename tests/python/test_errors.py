"""Every error path of the API raises the documented tensorhub.Error subclass."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

import tensorhub
from tensorhub import errors


def test_error_hierarchy():
    for code, cls in errors._BY_CODE.items():
        e = errors._from_status(code, errors.StatusCode(code).name, "boom")
        assert type(e) is cls and isinstance(e, tensorhub.Error)
        assert e.code == code and e.message == "boom"
        assert str(e) == f"{errors.StatusCode(code).name}: boom"
    assert issubclass(tensorhub.InvalidArgumentError, ValueError)
    assert issubclass(tensorhub.DeadlineExceededError, TimeoutError)
    assert issubclass(tensorhub.NotFoundError, LookupError)
    assert issubclass(tensorhub.UnavailableError, ConnectionError)
    # A fetch whose every holder served corrupt bytes ends DATA_LOSS (15).
    assert errors.error_class(15) is tensorhub.DataLossError
    import pickle
    e = pickle.loads(pickle.dumps(tensorhub.NotFoundError("gone", 5)))
    assert type(e) is tensorhub.NotFoundError and e.message == "gone"


def test_non_contiguous_numpy(connect, model_name):
    c = connect()
    a = np.zeros((4, 4), np.float32)[:, 1]
    with pytest.raises(tensorhub.InvalidArgumentError, match="not C-contiguous") as ei:
        c.publish(model_name, 1, {"a": a})
    assert ei.value.code == tensorhub.StatusCode.INVALID_ARGUMENT
    with pytest.raises(tensorhub.InvalidArgumentError, match="not C-contiguous"):
        c.fetch(model_name, into={"a": np.zeros((4, 4), np.float32).T})


def test_non_contiguous_torch(connect, model_name):
    torch = pytest.importorskip("torch")
    c = connect()
    with pytest.raises(tensorhub.InvalidArgumentError, match="not contiguous"):
        c.publish(model_name, 1, {"a": torch.zeros(4, 4).t()})


def test_unsupported_objects(connect, model_name):
    c = connect()
    with pytest.raises(TypeError, match="numpy.ndarray or torch.Tensor"):
        c.publish(model_name, 1, {"a": [1, 2, 3]})
    with pytest.raises(tensorhub.InvalidArgumentError, match="not supported"):
        c.publish(model_name, 1, {"a": np.zeros(3, np.complex64)})
    with pytest.raises(tensorhub.InvalidArgumentError, match="byte order"):
        c.publish(model_name, 1, {"a": np.zeros(3, ">f4")})
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(tensorhub.InvalidArgumentError, match="read-only"):
        c.fetch(model_name, into={"a": ro})
    buf = np.zeros(8, np.float32)
    with pytest.raises(tensorhub.InvalidArgumentError, match="share memory"):
        c.fetch(model_name, into={"a": buf[:5], "b": buf[3:]})
    for bad in (0, -1, True, "1", 1.5):
        with pytest.raises(tensorhub.InvalidArgumentError, match="version"):
            c.publish(model_name, bad, {"a": np.zeros(3)})


@pytest.fixture
def published(connect, model_name):
    pub = connect()
    pub.publish(model_name, 1, {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                                "b": np.zeros(3, np.int64)})
    return model_name, pub


def test_wrong_dtype(connect, published):
    model, _ = published
    sub = connect()
    with pytest.raises(tensorhub.InvalidArgumentError, match=r"'w' is F64\[2,3\] but .* has F32\[2,3\]"):
        sub.fetch(model, into={"w": np.zeros((2, 3), np.float64), "b": np.zeros(3, np.int64)})


def test_wrong_shape(connect, published):
    model, _ = published
    sub = connect()
    with pytest.raises(tensorhub.InvalidArgumentError, match=r"F32\[3,2\] but .* has F32\[2,3\]"):
        sub.fetch(model, into={"w": np.zeros((3, 2), np.float32), "b": np.zeros(3, np.int64)})


def test_wrong_names(connect, published):
    model, _ = published
    sub = connect()
    with pytest.raises(tensorhub.InvalidArgumentError, match="lacks tensor 'b'"):
        sub.fetch(model, into={"w": np.zeros((2, 3), np.float32)})
    with pytest.raises(tensorhub.InvalidArgumentError, match="'zzz' is not part of"):
        sub.fetch(model, into={"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.int64),
                               "zzz": np.zeros(1, np.int64)})


def test_unknown_model_and_version(connect, published):
    model, _ = published
    sub = connect()
    into = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.int64)}
    with pytest.raises(tensorhub.NotFoundError) as ei:
        sub.fetch("no-such-model", into=into)
    assert ei.value.code == tensorhub.StatusCode.NOT_FOUND
    with pytest.raises(tensorhub.NotFoundError, match="version 99"):
        sub.fetch(model, 99, into=into)
    with pytest.raises(tensorhub.NotFoundError):
        sub.describe("no-such-model")
    with pytest.raises(tensorhub.NotFoundError):
        sub.unpublish(model, 1)  # sub holds nothing


def test_uncommitted_version(connect, model_name):
    """Rank 0 of a group of 2 alone does not make a readable version."""
    pub, sub = connect(), connect()
    pub.publish(model_name, 1, {"w": np.ones(4, np.float32)}, rank=0, group_size=2)
    info = sub.describe(model_name, 1)
    assert info.state == "PENDING" and not info.committed
    with pytest.raises(tensorhub.FailedPreconditionError):
        sub.fetch(model_name, 1, into={"w": np.zeros(4, np.float32)}, timeout=5)
    # "latest" means the highest committed version: there is none.
    with pytest.raises((tensorhub.NotFoundError, tensorhub.FailedPreconditionError)):
        sub.fetch(model_name, into={"w": np.zeros(4, np.float32)}, timeout=5)
    # The second rank commits it.
    pub2 = connect()
    pub2.publish(model_name, 1, {"v": np.full(2, 7, np.int8)}, rank=1, group_size=2)
    out = {"w": np.zeros(4, np.float32), "v": np.zeros(2, np.int8)}
    assert sub.fetch(model_name, into=out) == 1
    assert out["w"].tolist() == [1.0] * 4 and out["v"].tolist() == [7, 7]


def test_version_not_increasing(connect, model_name):
    pub = connect()
    pub.publish(model_name, 5, {"w": np.ones(4, np.float32)})
    with pytest.raises(tensorhub.AlreadyExistsError, match="already published"):
        pub.publish(model_name, 5, {"w": np.ones(4, np.float32)})
    with pytest.raises(tensorhub.FailedPreconditionError):
        pub.publish(model_name, 3, {"w": np.ones(4, np.float32)})
    with pytest.raises(tensorhub.FailedPreconditionError):
        connect().publish(model_name, 4, {"w": np.ones(4, np.float32)})
    assert pub.held() == {(model_name, 5): 1}  # failed publishes hold nothing


def test_republish_same_memory_needs_unpublish(connect, model_name):
    pub = connect()
    w = np.ones(4, np.float32)
    pub.publish(model_name, 1, {"w": w})
    with pytest.raises(tensorhub.FailedPreconditionError, match="still published"):
        pub.publish(model_name, 2, {"w": w})
    pub.unpublish(model_name, 1)
    pub.publish(model_name, 2, {"w": w})


def test_chunk_checksum_names(connect, model_name):
    """A publisher names its chunk checksum; a reader verifies either kind
    (a holder's damaged copy is refused and read elsewhere); an unknown name
    fails the publish and holds nothing."""
    pub = connect()
    w1 = np.arange(300000, dtype=np.float32)
    with pytest.raises(tensorhub.InvalidArgumentError,
                       match="known: xxh3-64-tree-64k, xxh3-64"):
        pub.publish(model_name, 1, {"w": w1}, chunk_checksum="crc32")
    assert pub.held() == {}
    pub.publish(model_name, 1, {"w": w1}, chunk_checksum="xxh3-64")
    w2 = w1 * 2
    pub.publish(model_name, 2, {"w": w2})  # the default: the tree
    reader = connect()
    for v, want in ((1, w1), (2, w2)):
        got = np.zeros_like(want)
        reader.fetch(model_name, v, into={"w": got})
        np.testing.assert_array_equal(got, want)

    # A reader's served copy changes after its fetch (the contract says
    # unpublish first). The next reader reads from it first (the latest
    # holder to join; one chunk) and must refuse the damaged chunk and take
    # it from the publisher, under either kind.
    for v, kind in ((3, "xxh3-64"), (4, "xxh3-64-tree-64k")):
        w = np.arange(300000, dtype=np.float32) + v
        pub.publish(model_name, v, {"w": w}, chunk_checksum=kind)
        damaged = np.zeros_like(w)
        a = connect()
        a.fetch(model_name, v, into={"w": damaged})
        damaged[150000] += 1
        got = np.zeros_like(w)
        st = connect().fetch(model_name, v, into={"w": got}, return_stats=True)
        np.testing.assert_array_equal(got, w, err_msg=f"{kind}: damaged bytes kept")
        assert st.chunk_retries >= 1, (kind, st)
        a.close()  # unpublishes before `damaged` goes


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# A call that must end by its own timeout may overrun it by scheduling delays
# on a loaded machine: this much (seconds) is far more than those, and far
# less than anything else that could end it.
OVERRUN_SLACK_S = 10.0


def test_unreachable_hub_fails_within_timeout():
    addr = f"127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    with pytest.raises((tensorhub.UnavailableError, tensorhub.DeadlineExceededError)) as ei:
        tensorhub.connect(addr, connect_timeout=1.0)
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0 + OVERRUN_SLACK_S, elapsed
    assert addr in str(ei.value), str(ei.value)  # the error names the address


def test_connect_releases_the_gil():
    """A blocking connect must not stall other Python threads.

    The connect can only succeed if this thread runs Python code while it is
    blocked: it waits for a hub (gRPC wait-for-ready) that this thread starts
    only after seeing the connect's TCP connection arrive. Had the connect
    held the GIL, it would fail at its (far) timeout instead. No speed is
    assumed either way.
    """
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(30.0)
    port = listener.getsockname()[1]
    result = []

    def worker():
        try:
            result.append(tensorhub.connect(f"127.0.0.1:{port}", connect_timeout=30.0))
        except tensorhub.Error as e:
            result.append(e)

    th = threading.Thread(target=worker)
    th.start()
    hub = None
    try:
        conn, _ = listener.accept()  # the connect is under way
        conn.close()
        listener.close()
        hub = tensorhub.serve_hub(f"127.0.0.1:{port}", rebuild_ms=0)
        th.join(60.0)
        assert not th.is_alive()
        assert len(result) == 1 and isinstance(result[0], tensorhub.Client), result
        result[0].close()
    finally:
        listener.close()
        th.join(60.0)
        if hub is not None:
            hub.close()


def test_hub_gone_after_connect(model_name):
    hub = tensorhub.serve_hub()
    c = tensorhub.connect(hub.address, rpc_timeout=0.5)
    hub.close()
    t0 = time.monotonic()
    with pytest.raises((tensorhub.UnavailableError, tensorhub.DeadlineExceededError)):
        c.fetch(model_name, into={"w": np.zeros(1)}, timeout=1.0)
    assert time.monotonic() - t0 < 1.0 + OVERRUN_SLACK_S
    c.close()


def test_closed_client(connect, model_name):
    c = connect()
    c.close()
    c.close()  # idempotent
    assert c.closed
    with pytest.raises(tensorhub.FailedPreconditionError, match="closed"):
        c.publish(model_name, 1, {"w": np.zeros(1)})


def test_bad_connect_arguments(hub):
    with pytest.raises(TypeError, match="unknown options"):
        tensorhub.connect(hub.address, no_such_option=1)
    with pytest.raises(tensorhub.InvalidArgumentError, match="label"):
        tensorhub.connect(hub.address, labels={"zone": "x"})
