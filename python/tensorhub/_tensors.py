"""Turning numpy arrays and torch tensors into what the C++ layer takes.

The C++ layer takes a tensor as ``(name, dtype, shape, address, nbytes)``;
it never sees a Python object. This module checks that the memory behind an
object can be used as is (CPU, C-contiguous, native byte order, writable when
it is to be filled) and maps the element type to the safetensors name.

dtype rules
-----------
* numpy arrays map by their dtype: bool, uint8, int8, uint16, int16,
  float16, uint32, int32, float32, uint64, int64, float64 (native byte
  order). numpy has no bfloat16; if the ``ml_dtypes`` package's
  ``bfloat16`` / ``float8_e4m3fn`` / ``float8_e5m2`` dtypes are used they map
  to BF16 / F8_E4M3 / F8_E5M2.
* torch tensors map the same way, plus ``torch.bfloat16`` -> BF16 (and the
  unsigned and float8 types on torch versions that have them).
* Reinterpreting bytes is never implicit. ``publish(..., dtypes={name:
  "BF16"})`` publishes a same-sized array (e.g. numpy uint16 holding bf16
  bits) under another element type; ``fetch(..., allow_bitcast=True)``
  fills a same-sized array of another element type (e.g. a numpy uint16
  array from a BF16 tensor). Without them a mismatch is an
  InvalidArgumentError.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from .errors import InvalidArgumentError

#: Element size in bytes of each dtype name the library knows.
DTYPE_BYTES: Dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8,
    "F8_E4M3": 1, "F8_E5M2": 1,
}

_NUMPY_TO_NAME: Dict[np.dtype, str] = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint16): "U16",
    np.dtype(np.int16): "I16",
    np.dtype(np.float16): "F16",
    np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32",
    np.dtype(np.float32): "F32",
    np.dtype(np.uint64): "U64",
    np.dtype(np.int64): "I64",
    np.dtype(np.float64): "F64",
}
_NAME_TO_NUMPY: Dict[str, np.dtype] = {v: k for k, v in _NUMPY_TO_NAME.items()}

# dtypes of the optional ml_dtypes package, matched by name so that we do not
# have to import it.
_NUMPY_EXTRA_BY_NAME = {
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}

# (name of the torch attribute, dtype name); attributes a torch version lacks
# are skipped.
_TORCH_DTYPES = [
    ("bool", "BOOL"), ("uint8", "U8"), ("int8", "I8"), ("uint16", "U16"),
    ("int16", "I16"), ("float16", "F16"), ("bfloat16", "BF16"),
    ("uint32", "U32"), ("int32", "I32"), ("float32", "F32"),
    ("uint64", "U64"), ("int64", "I64"), ("float64", "F64"),
    ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"),
]

# (name, dtype, shape, address, nbytes, device): what _core takes. device is
# -1 for host memory, else the CUDA ordinal (torch's index in this process).
TensorTuple = Tuple[str, str, List[int], int, int, int]


def _torch() -> Any:
    """The torch module if the caller has imported it, else None.

    A torch tensor cannot exist unless torch is imported, so we never import
    it ourselves (it takes seconds).
    """
    return sys.modules.get("torch")


def torch_dtype_map() -> Dict[Any, str]:
    torch = _torch()
    if torch is None:
        return {}
    out = {}
    for attr, name in _TORCH_DTYPES:
        dt = getattr(torch, attr, None)
        if dt is not None:
            out[dt] = name
    return out


def is_torch_tensor(obj: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def numpy_dtype_name(dtype: np.dtype) -> Optional[str]:
    name = _NUMPY_TO_NAME.get(dtype)
    if name is None and dtype.name in _NUMPY_EXTRA_BY_NAME and dtype.itemsize in (1, 2):
        name = _NUMPY_EXTRA_BY_NAME[dtype.name]
    return name


def numpy_dtype_for(name: str) -> np.dtype:
    """The numpy dtype used to hold a tensor of dtype ``name``."""
    dt = _NAME_TO_NUMPY.get(name)
    if dt is not None:
        return dt
    raise InvalidArgumentError(
        f"numpy has no {name} dtype: use torch tensors, or uint{8 * DTYPE_BYTES[name]} "
        f"arrays with fetch(..., allow_bitcast=True)"
    )


def torch_dtype_for(name: str) -> Any:
    """The torch dtype used to hold a tensor of dtype ``name``."""
    for dt, n in torch_dtype_map().items():
        if n == name:
            return dt
    if _torch() is None:
        raise InvalidArgumentError("torch is not imported")
    raise InvalidArgumentError(f"this torch version has no {name} dtype")


def describe_object(obj: Any) -> str:
    if is_torch_tensor(obj):
        return f"torch tensor {obj.dtype} {tuple(obj.shape)} on {obj.device}"
    if isinstance(obj, np.ndarray):
        return f"numpy array {obj.dtype} {obj.shape}"
    return type(obj).__name__


def to_tuple(
    name: str,
    obj: Any,
    *,
    writable: bool,
    dtype_override: Optional[str] = None,
) -> TensorTuple:
    """Checks ``obj`` and returns its (name, dtype, shape, address, nbytes).

    ``writable``: the memory will be written (fetch destination).
    ``dtype_override``: publish / fill the bytes as this dtype instead of the
    object's own; only between dtypes of the same element size.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"tensor names must be non-empty strings, got {name!r}")
    device = -1
    if is_torch_tensor(obj):
        dtype, shape, address, nbytes, itemsize = _torch_view(name, obj, writable)
        if obj.device.type == "cuda":
            device = int(obj.device.index if obj.device.index is not None else 0)
    elif isinstance(obj, np.ndarray):
        dtype, shape, address, nbytes, itemsize = _numpy_view(name, obj, writable)
    else:
        raise TypeError(
            f"tensor '{name}': expected a numpy.ndarray or torch.Tensor, got "
            f"{type(obj).__module__}.{type(obj).__qualname__}"
        )
    if dtype_override is not None and dtype_override != dtype:
        want = DTYPE_BYTES.get(dtype_override)
        if want is None:
            raise InvalidArgumentError(
                f"tensor '{name}': unknown dtype {dtype_override!r}; known: "
                + ", ".join(DTYPE_BYTES)
            )
        if want != itemsize:
            raise InvalidArgumentError(
                f"tensor '{name}': cannot reinterpret {describe_object(obj)} "
                f"({itemsize}-byte elements) as {dtype_override} ({want}-byte elements)"
            )
        dtype = dtype_override
    return (name, dtype, shape, address, nbytes, device)


def _numpy_view(name: str, arr: np.ndarray, writable: bool):
    dtype = numpy_dtype_name(arr.dtype)
    if dtype is None:
        hint = ""
        if arr.dtype.byteorder not in ("=", "|") and arr.dtype.newbyteorder("=") in _NUMPY_TO_NAME:
            hint = " (non-native byte order: use arr.astype(arr.dtype.newbyteorder('=')))"
        raise InvalidArgumentError(
            f"tensor '{name}': numpy dtype {arr.dtype} is not supported{hint}; supported: "
            + ", ".join(str(d) for d in _NUMPY_TO_NAME)
        )
    if not arr.flags.c_contiguous:
        raise InvalidArgumentError(
            f"tensor '{name}': {describe_object(arr)} is not C-contiguous "
            f"(strides {arr.strides}); pass np.ascontiguousarray(x) and keep that "
            f"array, TensorHub reads and writes memory in place"
        )
    if writable and not arr.flags.writeable:
        raise InvalidArgumentError(f"tensor '{name}': the numpy array is read-only")
    address = arr.__array_interface__["data"][0]
    return dtype, [int(d) for d in arr.shape], int(address), int(arr.nbytes), arr.dtype.itemsize


def _torch_view(name: str, t: Any, writable: bool):
    torch = _torch()
    dtype = torch_dtype_map().get(t.dtype)
    if dtype is None:
        raise InvalidArgumentError(f"tensor '{name}': torch dtype {t.dtype} is not supported")
    if t.device.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(
            f"tensor '{name}' is on {t.device}; TensorHub moves host and CUDA memory only"
        )
    if t.layout != torch.strided:
        raise InvalidArgumentError(f"tensor '{name}': layout {t.layout} is not supported")
    if not t.is_contiguous():
        raise InvalidArgumentError(
            f"tensor '{name}': {describe_object(t)} is not contiguous "
            f"(stride {tuple(t.stride())}); pass t.contiguous() and keep that tensor, "
            f"TensorHub reads and writes memory in place"
        )
    for flag in ("is_conj", "is_neg"):
        f = getattr(t, flag, None)
        if f is not None and f():
            raise InvalidArgumentError(
                f"tensor '{name}' has a lazy {flag[3:]} bit; call t.resolve_{flag[3:]}() first"
            )
    itemsize = t.element_size()
    nbytes = t.numel() * itemsize
    return dtype, [int(d) for d in t.shape], int(t.data_ptr()), int(nbytes), itemsize


def to_tuples(
    tensors: Mapping[str, Any],
    *,
    writable: bool,
    dtypes: Optional[Mapping[str, str]] = None,
) -> List[TensorTuple]:
    if not isinstance(tensors, Mapping):
        raise TypeError(
            f"tensors must be a mapping of names to arrays/tensors, got {type(tensors).__name__}"
        )
    dtypes = dict(dtypes or {})
    unknown = set(dtypes) - set(tensors)
    if unknown:
        raise InvalidArgumentError(f"dtypes names tensors that are not given: {sorted(unknown)}")
    out = [
        to_tuple(n, t, writable=writable, dtype_override=dtypes.get(n))
        for n, t in tensors.items()
    ]
    if writable:
        _check_no_overlap(out)
    return out


def _check_no_overlap(tuples: List[TensorTuple]) -> None:
    """Fetch destinations must not share memory: the bytes would be
    overwritten by two tensors and served as one of them."""
    spans = sorted((t[3], t[3] + t[4], t[0]) for t in tuples if t[4] > 0)
    for (s0, e0, n0), (s1, e1, n1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise InvalidArgumentError(
                f"destination tensors '{n0}' and '{n1}' share memory; fetch each "
                f"tensor into its own buffer (tied weights: see tensorhub.torch)"
            )


def sync_cuda_streams(tensors: Mapping[str, Any]) -> None:
    """Waits for the current CUDA stream of every device ``tensors`` live on.

    TensorHub reads (publish) and writes (fetch) device memory from its own
    streams, so work the caller queued on its stream that writes (or still
    reads) those tensors must be finished first. Its copies are complete
    when publish / fetch return, so work queued afterwards sees them.
    """
    devices = set()
    for t in tensors.values():
        if is_torch_tensor(t) and t.device.type == "cuda":
            devices.add(t.device)
    if devices:
        torch = _torch()
        for d in devices:
            torch.cuda.current_stream(d).synchronize()


def spans(tuples: List[TensorTuple]) -> List[Tuple[int, int]]:
    return [(t[3], t[3] + t[4]) for t in tuples if t[4] > 0]


def overlaps(a: List[Tuple[int, int]], b: List[Tuple[int, int]]) -> bool:
    """Whether any half-open byte range of ``a`` intersects one of ``b``."""
    events = sorted([(s, e, 0) for s, e in a] + [(s, e, 1) for s, e in b])
    reach = [-1, -1]  # furthest end seen so far, per side
    for s, e, side in events:
        if s < reach[1 - side]:
            return True
        reach[side] = max(reach[side], e)
    return False
