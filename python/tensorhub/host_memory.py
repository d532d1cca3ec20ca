"""Host memory for weights moved on one host at memory speed.

A same-host fetch copies the holder's pages straight into the reader's
(cross-memory attach). The kernel pins every page of both sides for each
copy, so the page size sets the speed: between buffers of 2 MiB pages the
fetch runs at about memcpy's speed, between buffers of 4 KiB pages well
below it (docs/benchmarks.md, section 2). numpy and torch allocate with
malloc, which gets huge pages only where the kernel's transparent huge page
mode is "always"; a :class:`HostBuffer` asks for them in the default
"madvise" mode too.

    buf = tensorhub.HostBuffer(nbytes)            # zeroed, page-aligned
    w = numpy.frombuffer(buf, numpy.float32)      # or torch.frombuffer
    out = info.empty("torch")                     # a version's tensors in one

Views keep the buffer alive; it is freed when the last one is gone.
"""

from typing import Any, Dict, List, Sequence, Tuple

from ._native import core as _core
from .errors import InvalidArgumentError

HostBuffer = _core.HostBuffer

# Each tensor starts at a multiple of this in a carved buffer (a cache line:
# more than any dtype's alignment).
_TENSOR_ALIGNMENT = 64


def transparent_huge_page_mode() -> str:
    """The kernel's THP mode for anonymous memory: "always", "madvise",
    "never", or "" where /sys/kernel/mm/transparent_hugepage is missing."""
    return _core.transparent_huge_page_mode()


def carve(
    specs: Sequence[Tuple[str, Sequence[int], Any]], framework: str = "numpy"
) -> Dict[str, Any]:
    """Arrays (numpy) or tensors (torch) of the given (name, shape, dtype)
    in one fresh :class:`HostBuffer`, in order, each 64-byte aligned.

    ``dtype`` is a numpy dtype for ``"numpy"`` and a torch dtype for
    ``"torch"``. Zeroed."""
    if framework == "numpy":
        import numpy as np

        def itemsize(dt: Any) -> int:
            return np.dtype(dt).itemsize

        def view(buf: Any, dt: Any, count: int, off: int, shape: Tuple[int, ...]) -> Any:
            return np.frombuffer(buf, dtype=dt, count=count, offset=off).reshape(shape)

    elif framework == "torch":
        import torch

        def itemsize(dt: Any) -> int:
            return torch.empty((), dtype=dt).element_size()

        def view(buf: Any, dt: Any, count: int, off: int, shape: Tuple[int, ...]) -> Any:
            if count == 0:  # torch.frombuffer refuses an empty view
                return torch.empty(shape, dtype=dt)
            return torch.frombuffer(buf, dtype=dt, count=count, offset=off).reshape(shape)

    else:
        raise InvalidArgumentError(f"framework must be 'numpy' or 'torch', not {framework!r}")
    offsets: List[int] = []
    counts: List[int] = []
    total = 0
    for name, shape, dt in specs:
        count = 1
        for d in shape:
            if int(d) < 0:
                raise InvalidArgumentError(f"tensor {name!r}: negative dimension in {tuple(shape)}")
            count *= int(d)
        total = (total + _TENSOR_ALIGNMENT - 1) // _TENSOR_ALIGNMENT * _TENSOR_ALIGNMENT
        offsets.append(total)
        counts.append(count)
        total += count * itemsize(dt)
    buf = HostBuffer(max(total, 1))
    return {
        name: view(buf, dt, count, off, tuple(int(d) for d in shape))
        for (name, shape, dt), off, count in zip(specs, offsets, counts)
    }
