"""Resharding helpers: boxes of logical tensors and where a TP/EP rank's
slice of each standard Hugging Face tensor lies.

A *box* is ``(offset, extent)``: two lists, one entry per dimension. The
bytes of a box are laid out row-major over ``extent``, like a contiguous
tensor of that shape (``full[o0:o0+e0, o1:o1+e1, ...]``).

The rules are the C++ library's (``include/tensorhub/reshard.h``), called
through the binding, so C++ and Python agree:

* column-parallel (dim 0): ``q_proj k_proj v_proj gate_proj up_proj w1 w3``,
  weights and biases; with ``num_key_value_heads`` given, k/v keep whole kv
  heads, replicated over ``tp // num_kv_heads`` ranks when TP exceeds them
  (as vLLM does);
* row-parallel (dim 1): ``o_proj down_proj w2`` weights (their biases are
  replicated);
* vocab-parallel: ``embed_tokens`` and ``lm_head``, the vocabulary padded to
  a multiple of 64 and cut into TP equal ranges (vLLM's layout);
* everything else (norms, the MoE router, ...) replicated;
* MoE experts across EP ranks: :func:`ep_rank_box`.

dtype conversion (``convert``) is what a fetch applies on the way in:
BF16/F16/F32 to each other and to F8_E4M3 with ``scale = max(amax, 1e-12) /
448`` (:func:`fp8_scale`), equal to torch's ``(x.float() /
scale).to(torch.float8_e4m3fn)`` bit for bit (NaN stays NaN).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._native import core as _core
from ._tensors import DTYPE_BYTES, is_torch_tensor, torch_dtype_map
from .errors import InvalidArgumentError

Box = Tuple[List[int], List[int]]


def _dims(config: Optional[Mapping[str, Any]]) -> Dict[str, int]:
    """ModelDims from a Hugging Face config (dict or object), or nothing."""
    if config is None:
        return {}
    get = config.get if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
    out = {}
    for key, arg in (("num_attention_heads", "num_attention_heads"),
                     ("num_key_value_heads", "num_key_value_heads"),
                     ("head_dim", "head_dim")):
        v = get(key, None)
        if v:
            out[arg] = int(v)
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        v = get(key, None)
        if v:
            out["num_experts"] = int(v)
            break
    return out


def classify(name: str) -> str:
    """'column', 'row', 'vocab' or 'replicated' for a Hugging Face name."""
    return _core.classify_hf_tensor(name)


def tp_rank_box(name: str, shape: Sequence[int], rank: int, tp: int,
                config: Optional[Mapping[str, Any]] = None) -> Box:
    """The box rank ``rank`` of a TP=``tp`` engine holds of tensor ``name``."""
    off, ext = _core.tp_rank_box(name, [int(s) for s in shape], rank, tp, **_dims(config))
    return list(off), list(ext)


def ep_rank_box(name: str, shape: Sequence[int], rank: int, ep: int,
                num_experts: int) -> Box:
    """The box EP rank ``rank`` of ``ep`` holds (an empty box: none of it)."""
    off, ext = _core.ep_rank_box(name, [int(s) for s in shape], rank, ep, num_experts)
    return list(off), list(ext)


def fsdp_shards(shape: Sequence[int], k: int) -> List[Box]:
    """FSDP's flat dim-0 shards of a tensor over k ranks (near-equal)."""
    return [(list(o), list(e)) for o, e in _core.fsdp_shards([int(s) for s in shape], k)]


def tp_shards(shape: Sequence[int], dim: int, k: int) -> List[Box]:
    """TP shards of a tensor along ``dim`` over k ranks (near-equal)."""
    return [(list(o), list(e)) for o, e in _core.tp_shards([int(s) for s in shape], dim, k)]


def box_slices(box: Box) -> Tuple[slice, ...]:
    """The index of a box: ``full[box_slices(b)]`` is the box's data."""
    off, ext = box
    return tuple(slice(o, o + e) for o, e in zip(off, ext))


def box_elements(box: Box) -> int:
    n = 1
    for e in box[1]:
        n *= int(e)
    return n


def fp8_scale(amax: float) -> float:
    """max(amax, 1e-12) / 448 in float32: the scale for float8_e4m3fn."""
    return _core.fp8_scale(float(amax))


def _dtype_name(obj: Any) -> str:
    if is_torch_tensor(obj):
        name = torch_dtype_map().get(obj.dtype)
    else:
        from ._tensors import numpy_dtype_name
        name = numpy_dtype_name(obj.dtype)
    if name is None:
        raise InvalidArgumentError(f"unsupported dtype {obj.dtype}")
    return name


def convert(src: Any, dst: Any, scale: float = 1.0) -> None:
    """Converts ``src`` into ``dst`` (same number of elements, both
    C-contiguous CPU numpy arrays or torch tensors) with the conversion a
    fetch applies: BF16/F16/F32 to each other and to F8_E4M3 (``scale``
    divides first). For tests and for callers converting on their own."""
    def addr(t: Any) -> int:
        if is_torch_tensor(t):
            if t.device.type != "cpu" or not t.is_contiguous():
                raise InvalidArgumentError("convert takes contiguous CPU tensors")
            return t.data_ptr()
        if not t.flags["C_CONTIGUOUS"]:
            raise InvalidArgumentError("convert takes C-contiguous arrays")
        return t.ctypes.data
    n_src = src.numel() if is_torch_tensor(src) else src.size
    n_dst = dst.numel() if is_torch_tensor(dst) else dst.size
    if n_src != n_dst:
        raise InvalidArgumentError(f"convert: {n_src} elements into {n_dst}")
    _core.convert(_dtype_name(src), _dtype_name(dst), addr(src), addr(dst), n_src, float(scale))


def tp_slices(shapes: Mapping[str, Sequence[int]], rank: int, tp: int,
              config: Optional[Mapping[str, Any]] = None, dtype: Any = None,
              names: Optional[Sequence[str]] = None) -> Dict[str, Tuple[Any, Box]]:
    """What TP rank ``rank`` of ``tp`` fetches: ``{name: (empty tensor,
    box)}`` for ``client.fetch(model, version, into=...)``.

    ``shapes`` maps each tensor's name to its global shape (e.g. ``{k:
    v.shape for k, v in model.state_dict().items()}``); ``dtype`` is the
    torch dtype wanted (conversion on the way in; default bfloat16);
    ``config`` the model's Hugging Face config for the GQA head counts.
    Tensors the rank holds none of (a vocabulary range past the end) are
    left out."""
    import torch  # a torch user's helper
    dt = dtype if dtype is not None else torch.bfloat16
    out: Dict[str, Tuple[Any, Box]] = {}
    for name, shape in shapes.items():
        if names is not None and name not in names:
            continue
        box = tp_rank_box(name, shape, rank, tp, config)
        if box_elements(box) == 0:
            continue
        out[name] = (torch.empty(box[1], dtype=dt), box)
    return out


def tp_rank_buffers(tensors: Mapping[str, Tuple[Sequence[int], Any]], rank: int, tp: int,
                    config: Optional[Mapping[str, Any]] = None):
    """Full-shape tensors of which TP rank ``rank`` of ``tp`` fetches only
    its own box, for loaders that take whole tensors and narrow them to the
    rank's part themselves (vLLM's ``load_weights``).

    ``tensors`` maps names to ``(global shape, torch dtype)``. Returns
    ``(full, into, finish)``: ``full`` maps each name to an uninitialised
    tensor of its global shape (``torch.empty``: pages outside the box are
    never touched, so they cost address space, not memory); ``into`` is the
    ``client.fetch(..., into=into)`` argument of ``(tensor, box)`` pairs, a
    view of ``full`` where the box is contiguous in it (dim-0 slices, whole
    tensors) and a separate buffer otherwise; ``finish()`` copies those
    separate buffers into place after the fetch. Only the box of each
    tensor holds fetched bytes: hand ``full`` to a loader that reads just
    that box."""
    import torch  # a torch user's helper
    full: Dict[str, Any] = {}
    into: Dict[str, Tuple[Any, Box]] = {}
    copies = []
    for name, (shape, dtype) in tensors.items():
        t = torch.empty([int(x) for x in shape], dtype=dtype)
        full[name] = t
        box = tp_rank_box(name, shape, rank, tp, config)
        if box_elements(box) == 0:
            continue
        region = t[tuple(slice(o, o + e) for o, e in zip(box[0], box[1]))]
        if region.is_contiguous():
            into[name] = (region, box)
        else:
            dest = torch.empty(box[1], dtype=dtype)
            into[name] = (dest, box)
            copies.append((region, dest))

    def finish() -> None:
        for region, dest in copies:
            region.copy_(dest)

    return full, into, finish


__all__ = [
    "Box", "classify", "tp_rank_box", "ep_rank_box", "fsdp_shards", "tp_shards",
    "box_slices", "box_elements", "tp_slices", "tp_rank_buffers", "fp8_scale", "convert",
    "DTYPE_BYTES",
]
