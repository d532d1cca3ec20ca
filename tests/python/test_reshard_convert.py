"""The resharding helpers against torch: dtype conversions bit for bit, and
the layout helpers against torch slicing.

float8_e4m3fn needs torch >= 2.1: with Debian's torch 1.13 (the .venv) those
cases skip, saying so; tests/engines/run.sh runs this file again in
.venv-vllm, whose torch has it.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tensorhub import reshard  # noqa: E402

FLOATS = [torch.bfloat16, torch.float16, torch.float32]
HAS_FP8 = hasattr(torch, "float8_e4m3fn")


def _all_16bit(dtype):
    """Every bit pattern of a 16-bit float dtype, as a tensor of it."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    return bits.view(dtype)


def _inputs(dtype):
    """Every value of a 16-bit dtype; for F32, 2^20 seeded random patterns
    plus the edges (every BF16 and F16 value, widened)."""
    if dtype != torch.float32:
        return _all_16bit(dtype)
    g = np.random.default_rng(7)
    rnd = torch.from_numpy(g.integers(0, 1 << 32, size=1 << 20, dtype=np.uint64)
                           .astype(np.uint32).view(np.int32)).view(torch.float32)
    return torch.cat([rnd, _all_16bit(torch.bfloat16).float(), _all_16bit(torch.float16).float()])


def _bits(t):
    width = {1: torch.int8, 2: torch.int16, 4: torch.int32}[t.element_size()]
    return t.contiguous().view(width).numpy()


def _assert_same(got, want):
    """Bit equality, except that a NaN may be any NaN (torch's own encodings
    differ between its code paths)."""
    gnan = torch.isnan(got.float()).numpy()
    wnan = torch.isnan(want.float()).numpy()
    np.testing.assert_array_equal(gnan, wnan)
    keep = ~wnan
    np.testing.assert_array_equal(_bits(got)[keep], _bits(want)[keep])


@pytest.mark.parametrize("src", FLOATS, ids=str)
@pytest.mark.parametrize("dst", FLOATS, ids=str)
def test_float_casts_equal_torch(src, dst):
    x = _inputs(src)
    got = torch.empty(x.shape, dtype=dst)
    reshard.convert(x, got)
    _assert_same(got, x.to(dst))


@pytest.mark.skipif(not HAS_FP8, reason=f"torch {torch.__version__} has no float8_e4m3fn (needs >= 2.1)")
@pytest.mark.parametrize("src", FLOATS, ids=str)
def test_fp8_per_tensor_equals_torch(src):
    x = _inputs(src)
    finite = x[torch.isfinite(x.float())]
    # A realistic weight (scale from its own amax), and every input pattern
    # with a fixed scale (NaN, inf, overflow, subnormals).
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(4096, generator=g) * 0.02).to(src)
    for data, amax in ((w, w.float().abs().max()), (x, finite.float().abs().max()),
                       (x, torch.tensor(1.0))):
        scale = torch.clamp(amax.float(), min=1e-12) / 448.0
        assert reshard.fp8_scale(float(amax)) == float(scale)
        want = (data.float() / scale).to(torch.float8_e4m3fn)
        got = torch.empty(data.shape, dtype=torch.float8_e4m3fn)
        reshard.convert(data, got, float(scale))
        _assert_same(got, want)


@pytest.mark.skipif(not HAS_FP8, reason=f"torch {torch.__version__} has no float8_e4m3fn (needs >= 2.1)")
def test_fp8_per_channel_equals_torch():
    g = torch.Generator().manual_seed(2)
    w = (torch.randn(37, 53, generator=g) * torch.linspace(0.001, 3, 37)[:, None]).to(torch.bfloat16)
    amax = w.float().abs().amax(dim=1, keepdim=True)
    scale = torch.clamp(amax, min=1e-12) / 448.0
    want = (w.float() / scale).to(torch.float8_e4m3fn)
    got = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
    for r in range(w.shape[0]):
        s = reshard.fp8_scale(float(amax[r, 0]))
        assert s == float(scale[r, 0])
        reshard.convert(w[r].contiguous(), got[r], s)
    _assert_same(got, want)


def test_convert_refuses_other_dtypes():
    with pytest.raises(Exception, match="cannot convert I32 to F32"):
        reshard.convert(np.zeros(4, np.int32), np.zeros(4, np.float32))


LLAMA = {"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 4}


def _tiny_llama():
    """Shapes of a tiny Llama-shaped state dict with odd sizes."""
    h, inter, vocab = 32, 45, 101
    return {
        "model.embed_tokens.weight": (vocab, h),
        "model.layers.0.self_attn.q_proj.weight": (32, h),
        "model.layers.0.self_attn.k_proj.weight": (8, h),
        "model.layers.0.self_attn.v_proj.weight": (8, h),
        "model.layers.0.self_attn.o_proj.weight": (h, 32),
        "model.layers.0.mlp.gate_proj.weight": (inter, h),
        "model.layers.0.mlp.up_proj.weight": (inter, h),
        "model.layers.0.mlp.down_proj.weight": (h, inter),
        "model.layers.0.input_layernorm.weight": (h,),
        "model.norm.weight": (h,),
        "lm_head.weight": (vocab, h),
    }


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tp_boxes_follow_vllm_layout(tp):
    for name, shape in _tiny_llama().items():
        kind = reshard.classify(name)
        boxes = [reshard.tp_rank_box(name, shape, r, tp, LLAMA) for r in range(tp)]
        full = torch.arange(int(np.prod(shape))).reshape(shape)
        for r, box in enumerate(boxes):
            part = full[reshard.box_slices(box)]
            if kind == "replicated":
                assert torch.equal(part, full)
            elif kind == "row":
                assert torch.equal(part, torch.tensor_split(full, tp, dim=1)[r])
            elif name.endswith(("k_proj.weight", "v_proj.weight")) and tp > 2:
                head = r // (tp // 2)  # 2 kv heads replicated over tp/2 ranks
                assert torch.equal(part, full[head * 4:(head + 1) * 4])
            elif kind == "vocab":
                per = ((shape[0] + 63) // 64 * 64) // tp
                assert torch.equal(part, full[min(r * per, shape[0]):min((r + 1) * per, shape[0])])
            else:
                assert torch.equal(part, torch.tensor_split(full, tp, dim=0)[r])


def test_trainer_shards_tile():
    for k in (1, 2, 4, 8):
        for shape in ((7, 5), (3,), (45, 32)):
            fs = reshard.fsdp_shards(shape, k)
            assert sum(reshard.box_elements(b) for b in fs) == int(np.prod(shape))
            assert [b[0][0] for b in fs] == sorted(b[0][0] for b in fs)
            ts = reshard.tp_shards(shape, len(shape) - 1, k)
            assert sum(reshard.box_elements(b) for b in ts) == int(np.prod(shape))
    assert reshard.ep_rank_box("m.layers.0.mlp.experts.5.w1.weight", (4, 4), 1, 4, 8) == ([0, 0], [0, 0])
    assert reshard.ep_rank_box("m.layers.0.mlp.experts.5.w1.weight", (4, 4), 2, 4, 8) == ([0, 0], [4, 4])
