"""ReadTrace: the boxes of each tensor that operations read (the TP slice
path's source of truth), on the torch of the vLLM venv."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm", reason="needs the vLLM venv's torch: bash tests/engines/run.sh")

from tensorhub.read_trace import ReadTrace, contains, view_box  # noqa: E402


def _trace(tensors, fn):
    with ReadTrace(tensors) as tr:
        fn()
    return tr.boxes


def test_loader_narrows_are_exact():
    buf = torch.empty(4 * 6 + 8 * 6 + 5)  # one allocation, as VersionInfo.empty carves it
    w = {"col": buf[:24].view(4, 6), "row": buf[24:72].view(8, 6), "unread": buf[72:]}
    dst0, dst1 = torch.empty(2, 6), torch.empty(8, 3)
    boxes = _trace(w, lambda: (dst0.copy_(w["col"].narrow(0, 2, 2)),
                               dst1.copy_(w["row"].narrow(1, 3, 3))))
    assert boxes == {"col": ([2, 0], [2, 6]), "row": ([0, 3], [8, 3])}


def test_chunks_transposes_and_selects():
    w = {"w13": torch.randn(3, 8, 4)}  # experts x rows x cols
    out = torch.empty(4, 2)
    boxes = _trace(w, lambda: out.copy_(w["w13"][1].chunk(2, 0)[1][:, 1:3].t().t()))
    assert boxes["w13"] == ([1, 4, 1], [1, 4, 2])
    assert torch.equal(out, w["w13"][1, 4:8, 1:3])


def test_a_reshape_across_dimensions_gives_a_superset():
    w = {"x": torch.randn(4, 6)}
    out = torch.empty(12)
    boxes = _trace(w, lambda: out.copy_(w["x"][1:3].reshape(-1)))
    assert contains(boxes["x"], ([1, 0], [2, 6]))
    off, ext = view_box([4, 6], 7, [10], [1])  # a flat span across rows 1 and 2
    assert contains((off, ext), ([1, 1], [1, 5])) and contains((off, ext), ([2, 0], [1, 5]))


def test_views_alone_read_nothing():
    w = {"x": torch.randn(4, 6)}
    boxes = _trace(w, lambda: w["x"].narrow(0, 1, 2).t())
    assert boxes == {}


def test_reads_union_into_one_bounding_box():
    w = {"x": torch.randn(8, 6)}
    a, b = torch.empty(1, 6), torch.empty(1, 6)
    boxes = _trace(w, lambda: (a.copy_(w["x"][1:2]), b.copy_(w["x"][5:6])))
    assert boxes["x"] == ([1, 0], [5, 6])
