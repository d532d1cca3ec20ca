"""Partial fetch from Python: a trainer group publishes FSDP shards, TP
ranks fetch their slices (into={name: (tensor, box)}), byte for byte equal
to torch slicing of the full tensors, with a dtype conversion."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tensorhub import reshard  # noqa: E402

CONFIG = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}


def _model():
    g = torch.Generator().manual_seed(0)
    shapes = {
        "model.embed_tokens.weight": (131, 32),
        "model.layers.0.self_attn.q_proj.weight": (32, 32),
        "model.layers.0.self_attn.k_proj.weight": (16, 32),
        "model.layers.0.self_attn.o_proj.weight": (32, 32),
        "model.layers.0.mlp.down_proj.weight": (32, 45),
        "model.layers.0.mlp.up_proj.weight": (45, 32),
        "model.norm.weight": (32,),
    }
    return {k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shapes.items()}


@pytest.mark.parametrize("k,tp", [(2, 4), (4, 2), (3, 1)])
def test_tp_ranks_fetch_their_slices(connect, k, tp):
    full = _model()
    model = f"reshard-{k}-{tp}"
    trainers = [connect() for _ in range(k)]
    for r in range(k):
        tensors, pieces = {}, {}
        for name, t in full.items():
            off, ext = reshard.fsdp_shards(t.shape, k)[r]
            if reshard.box_elements((off, ext)) == 0:
                continue
            tensors[name] = t[reshard.box_slices((off, ext))].contiguous()
            pieces[name] = (list(t.shape), off)
        trainers[r].publish(model, 1, tensors, rank=r, group_size=k, pieces=pieces,
                            segment_bytes=256)
    reader = connect()
    shapes = {n: t.shape for n, t in full.items()}
    for rank in range(tp):
        into = reshard.tp_slices(shapes, rank, tp, CONFIG)
        stats = reader.fetch(model, 1, into=into, return_stats=True)
        assert stats.version == 1
        for name, (got, box) in into.items():
            assert torch.equal(got.view(torch.int16),
                               full[name][reshard.box_slices(box)].contiguous().view(torch.int16)), name
    # Conversion on the way in: float32 slices.
    into = reshard.tp_slices(shapes, 0, tp, CONFIG, dtype=torch.float32)
    reader.fetch(model, 1, into=into)
    for name, (got, box) in into.items():
        assert torch.equal(got, full[name][reshard.box_slices(box)].float()), name
    for t in trainers:
        t.unpublish(model, 1)


def test_bad_box_is_refused(connect):
    t = connect()
    t.publish("reshard-bad", 1, {"w": torch.zeros(4, 4)})
    out = torch.full((2, 4), 7.0)
    with pytest.raises(Exception, match="outside"):
        connect().fetch("reshard-bad", 1, into={"w": (out, ([3, 0], [2, 4]))})
    assert torch.all(out == 7.0)


def _vllm_region(name, shape, rank, tp):
    """The part of a whole tensor vLLM's loaders narrow TP rank ``rank`` to
    (written out here from vLLM's rules, not from the layout helpers):
    column-parallel weights along dim 0 in equal parts (q by query heads, k
    and v by kv heads), row-parallel ones along dim 1, the vocabulary padded
    to a multiple of 64 and split evenly, the rest whole."""
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        per = -(-shape[0] // 64) * 64 // tp
        return (slice(rank * per, min((rank + 1) * per, shape[0])),)
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight",
                      "up_proj.weight", "gate_proj.weight")):
        per = shape[0] // tp
        return (slice(rank * per, (rank + 1) * per),)
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        per = shape[1] // tp
        return (slice(None), slice(rank * per, (rank + 1) * per))
    return tuple(slice(None) for _ in shape)


def test_tp_rank_buffers_give_vllm_its_narrowed_slices(connect):
    """What the vLLM backend does at TP > 1 (tp_rank_buffers): whole-shape
    tensors of which each rank fetched only its box; the part vLLM's loader
    narrows to equals the published tensor. The ranks serve their slices
    onward: a second engine's rank reads them from the first's."""
    g = torch.Generator().manual_seed(1)
    shapes = {
        "model.embed_tokens.weight": (131, 32),
        "model.layers.0.self_attn.q_proj.weight": (32, 32),
        "model.layers.0.self_attn.k_proj.weight": (16, 32),
        "model.layers.0.self_attn.o_proj.weight": (32, 32),
        "model.layers.0.mlp.up_proj.weight": (48, 32),
        "model.layers.0.mlp.down_proj.weight": (32, 48),
        "model.norm.weight": (32,),
    }
    full = {k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shapes.items()}
    model, k, tp = "vllm-slices", 2, 2
    trainers = [connect() for _ in range(k)]
    for r in range(k):
        tensors, pieces = {}, {}
        for name, t in full.items():
            box = reshard.fsdp_shards(t.shape, k)[r]
            if reshard.box_elements(box) == 0:
                continue
            tensors[name] = t[reshard.box_slices(box)].contiguous()
            pieces[name] = (list(t.shape), box[0])
        trainers[r].publish(model, 1, tensors, rank=r, group_size=k, pieces=pieces,
                            segment_bytes=256)
    wanted = {n: (s, torch.bfloat16) for n, s in shapes.items()}
    first = [connect() for _ in range(tp)]
    second = [connect() for _ in range(tp)]
    holders = {c.worker_id for c in first}
    for engine, serve in ((first, True), (second, False)):
        for rank in range(tp):
            bufs, into, finish = reshard.tp_rank_buffers(wanted, rank, tp, CONFIG)
            stats = engine[rank].fetch(model, 1, into=into, return_stats=True,
                                       connections=1, serve_slices=serve)
            finish()
            total = sum(t.numel() * 2 for t, _ in into.values())
            assert stats.bytes >= total
            for name, shape in shapes.items():
                region = _vllm_region(name, shape, rank, tp)
                assert torch.equal(bufs[name][region].view(torch.int16),
                                   full[name][region].view(torch.int16)), (name, rank)
            if engine is second:
                # One stream, and the hub lists holders of slices first.
                from_first = sum(s["bytes"] for s in stats.sources if s["worker"] in holders)
                assert from_first == stats.bytes, (rank, stats.sources)
    for c in first:
        c.unpublish(model, 1)
    for t in trainers:
        t.unpublish(model, 1)


def test_whole_fetch_of_pieces_serves_onward_after_the_ranks_leave(connect):
    """A version a 2-rank group published as pieces, fetched whole with
    serve=True by reader A: A serves it onward (a holder of slices whose
    boxes are the whole tensors), so once both ranks unpublished it, reader
    B still fetches it, whole and as slices, every byte from A; A's
    unpublish withdraws it and the client lets go of A's tensors."""
    full = _model()
    model, k = "pieces-served-onward", 2
    trainers = [connect() for _ in range(k)]
    for r in range(k):
        tensors, pieces = {}, {}
        for name, t in full.items():
            box = reshard.fsdp_shards(t.shape, k)[r]
            if reshard.box_elements(box) == 0:
                continue
            tensors[name] = t[reshard.box_slices(box)].contiguous()
            pieces[name] = (list(t.shape), box[0])
        trainers[r].publish(model, 1, tensors, rank=r, group_size=k, pieces=pieces,
                            segment_bytes=256)
    a, b = connect(), connect()
    info = a.describe(model, 1)
    held = info.empty("torch")
    assert a.fetch(model, 1, into=held, serve=True) == 1
    assert a.held() == {(model, 1): len(full)}
    for t in trainers:
        t.unpublish(model, 1)
    assert [v.state for v in b.versions(model)] == ["COMMITTED"]

    mine = info.empty("torch")
    stats = b.fetch(model, "latest", into=mine, serve=False, return_stats=True)
    assert stats.version == 1
    for name, t in full.items():
        assert torch.equal(mine[name].view(torch.int16), t.view(torch.int16)), name
    assert {s["worker"] for s in stats.sources} == {a.worker_id}
    into = reshard.tp_slices({n: t.shape for n, t in full.items()}, 1, 2, CONFIG)
    stats = b.fetch(model, 1, into=into, return_stats=True)
    for name, (got, box) in into.items():
        assert torch.equal(got.view(torch.int16),
                           full[name][reshard.box_slices(box)].contiguous().view(torch.int16)), name
    assert {s["worker"] for s in stats.sources} == {a.worker_id}

    a.unpublish(model, 1)
    assert a.held() == {}
    assert [v.state for v in b.versions(model)] == ["UNAVAILABLE"]
