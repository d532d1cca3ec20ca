"""Which part of each tensor a loader actually reads.

A tensor-parallel engine rank needs only part of each weight: the rows or
columns its ``weight_loader`` narrows to, a range of experts, nothing of a
tied ``lm_head`` it skips. Name rules guess that part and go wrong for any
name they do not know (fused or renamed tensors, MoE experts, quantization
scales), and a loader that reads outside the fetched part reads garbage.

:class:`ReadTrace` learns the part from the loader itself. It is a
``TorchDispatchMode``: while it is active, every aten operation that takes a
view of a traced tensor as input (other than view operations, which read
nothing) records the region of that tensor the view covers, as a box
(offset, extent per dimension): exact for views made by ``narrow``,
slicing, ``select``, ``chunk``, ``split`` and transposes, and a bounding
box for anything else (a ``reshape`` across dimensions), which is a
superset. A tensor whose memory no operation touched is not read at all.

The vLLM backend traces the load of a whole version once, then fetches only
the traced boxes in later updates, and traces those loads too: a read
outside a fetched box (a loader that changed its mind) is reported, and the
backend then fetches the whole tensors and loads again. No byte a loader
reads is ever left unfetched.
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

Box = Tuple[List[int], List[int]]

# Operations that look at a tensor's metadata only (shape, dtype, device).
_METADATA_OPS = {
    "empty_like", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full",
    "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like",
    "_has_compatible_shallow_copy_type", "is_same_size", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "is_contiguous", "is_non_overlapping_and_dense",
}


def _contiguous_strides(shape: Sequence[int]) -> List[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(int(s), 1)
    return list(reversed(out))


def _unravel(index: int, shape: Sequence[int]) -> List[int]:
    out = []
    for s in reversed(shape):
        out.append(index % s)
        index //= s
    return list(reversed(out))


def view_box(base_shape: Sequence[int], offset: int, sizes: Sequence[int],
             strides: Sequence[int]) -> Box:
    """The box of a contiguous tensor of ``base_shape`` that a strided view
    (element ``offset`` into it, ``sizes``, ``strides``) covers: exact when
    each view dimension walks one base dimension, else the smallest box
    holding the view's span (a superset)."""
    shape = [int(s) for s in base_shape]
    if not shape:
        return [], []
    if any(int(s) == 0 for s in sizes):
        return [0] * len(shape), [0] * len(shape)
    base_strides = _contiguous_strides(shape)
    start = _unravel(offset, shape)
    off, ext = list(start), [1] * len(shape)
    used = set()
    exact = True
    for size, stride in zip(sizes, strides):
        size, stride = int(size), int(stride)
        if size == 1:
            continue
        dims = [d for d, bs in enumerate(base_strides) if bs == stride and shape[d] > 1]
        if len(dims) != 1 or dims[0] in used or start[dims[0]] + size > shape[dims[0]]:
            exact = False
            break
        used.add(dims[0])
        ext[dims[0]] = size
    if exact:
        return off, ext
    lo = offset + sum(min(0, (int(s) - 1) * int(st)) for s, st in zip(sizes, strides))
    hi = offset + sum(max(0, (int(s) - 1) * int(st)) for s, st in zip(sizes, strides))
    a, b = _unravel(max(lo, 0), shape), _unravel(min(hi, math.prod(shape) - 1), shape)
    off, ext = [0] * len(shape), list(shape)
    for d in range(len(shape)):
        if a[d] == b[d]:
            off[d], ext[d] = a[d], 1
            continue
        off[d], ext[d] = a[d], b[d] - a[d] + 1
        break
    return off, ext


def union(a: Optional[Box], b: Box) -> Box:
    """The bounding box of two boxes (a None: b)."""
    if a is None:
        return list(b[0]), list(b[1])
    off = [min(x, y) for x, y in zip(a[0], b[0])]
    end = [max(x + e, y + f) for x, e, y, f in zip(a[0], a[1], b[0], b[1])]
    return off, [e - o for o, e in zip(off, end)]


def contains(outer: Box, inner: Box) -> bool:
    return all(o <= i and i + f <= o + e
               for o, e, i, f in zip(outer[0], outer[1], inner[0], inner[1]))


class ReadTrace(TorchDispatchMode):
    """Records which box of each traced tensor the operations run under it read.

    ``tensors`` maps names to contiguous tensors (any device; they may share
    one allocation). After the ``with`` block, :attr:`boxes` maps every name
    read to the bounding box of its reads; names never read are absent.
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        spans = []
        for name, t in tensors.items():
            if not t.is_contiguous():
                raise ValueError(f"ReadTrace: {name!r} is not contiguous")
            n = t.numel() * t.element_size()
            if n:
                spans.append((t.data_ptr(), t.data_ptr() + n, name, t))
        spans.sort(key=lambda s: s[0])
        self._starts = [s[0] for s in spans]
        self._spans = spans
        self.boxes: Dict[str, Box] = {}

    def _record(self, a: torch.Tensor) -> None:
        if a.numel() == 0 or a.device.type == "meta":
            return
        ptr = a.data_ptr()
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i < 0:
            return
        start, end, name, base = self._spans[i]
        if ptr >= end or a.dtype.itemsize != base.element_size():
            if ptr < end:  # a reinterpreting view: count the whole tensor
                self.boxes[name] = ([0] * base.dim(), list(base.shape))
            return
        box = view_box(list(base.shape), (ptr - start) // base.element_size(),
                       list(a.shape), list(a.stride()))
        self.boxes[name] = union(self.boxes.get(name), box)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if not getattr(func, "is_view", False) and name not in _METADATA_OPS:
            flat, _ = tree_flatten((args, kwargs))
            for a in flat:
                if isinstance(a, torch.Tensor) and self._spans:
                    self._record(a)
        return func(*args, **kwargs)


__all__ = ["ReadTrace", "view_box", "union", "contains", "Box"]
