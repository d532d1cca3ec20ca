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
