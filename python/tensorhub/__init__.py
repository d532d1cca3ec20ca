"""TensorHub: move model weight versions from trainers to rollout workers.

A hub tracks which worker holds which version of a model; readers pull the
bytes peer to peer, and every reader that finishes becomes a holder itself.

    import numpy as np, tensorhub

    with tensorhub.serve_hub() as hub, \\
         tensorhub.connect(hub.address) as trainer, \\
         tensorhub.connect(hub.address) as rollout:
        w = {"w": np.arange(4, dtype=np.float32)}
        trainer.publish("policy", 1, w)          # no copy; w is served
        out = {"w": np.empty(4, dtype=np.float32)}
        v = rollout.fetch("policy", "latest", into=out)
        trainer.unpublish("policy", 1)           # drains reads; w is ours again

Errors are subclasses of :class:`tensorhub.Error` (see tensorhub.errors).
The dtype rules are in tensorhub._tensors; the PyTorch helpers in
tensorhub.torch; the node copy (one host copy shared by a host's engines)
in tensorhub.node. Logging goes through Python's ``logging``, under the
``"tensorhub"`` logger (tensorhub._log says how to see it).

Importing ``tensorhub`` loads no native code: the C++ library is loaded by
the first name that needs it (``connect``, ``serve_hub``, ``HostBuffer``,
``__version__``, ...), so that the vLLM plugin entry point
(``tensorhub.vllm:register``) costs a vLLM process that never uses the
backend nothing but a few pure-Python modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict

from . import _log
from .errors import (
    AbortedError,
    AlreadyExistsError,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    StatusCode,
    UnavailableError,
)

if TYPE_CHECKING:  # what the lazy names below resolve to
    from .client import Client, FetchStats, Holder, TensorInfo, VersionInfo, VersionSummary, connect
    from .host_memory import HostBuffer, transparent_huge_page_mode
    from .hub import Hub, serve_hub

# name -> the submodule that defines it; loaded on first use (PEP 562).
_LAZY = {
    "Client": ".client",
    "FetchStats": ".client",
    "Holder": ".client",
    "TensorInfo": ".client",
    "VersionInfo": ".client",
    "VersionSummary": ".client",
    "connect": ".client",
    "HostBuffer": ".host_memory",
    "transparent_huge_page_mode": ".host_memory",
    "Hub": ".hub",
    "serve_hub": ".hub",
}


def build_info() -> Dict[str, Any]:
    """The version and what this build can do: ``version``, ``cuda`` (and
    ``cuda_version``), ``ucx`` (and ``ucx_version``), ``tls`` (and
    ``tls_library``, the OpenSSL loaded), and ``line``, what
    ``tensorhub --version`` prints."""
    from ._native import core

    return dict(core.build_info())


def _version() -> str:
    """PEP 440, with the build's features as the local label, as torch does
    ("2.5.0+cu124"): "0.1.0+cuda.ucx.tls"."""
    info = build_info()
    features = [name for name in ("cuda", "ucx", "tls") if info[name]]
    return info["version"] + ("+" + ".".join(features) if features else "")


def set_log_level(level: str) -> None:
    """Sets the level of the ``"tensorhub"`` logger and of the C++ library:
    "debug", "info", "warn" or "error". Output goes wherever Python's
    ``logging`` is configured to send it (tensorhub._log)."""
    _log.set_level(level)


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _version()
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    else:
        raise AttributeError(f"module 'tensorhub' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})


__all__ = [
    "build_info",
    "connect",
    "serve_hub",
    "set_log_level",
    "Client",
    "Hub",
    "HostBuffer",
    "transparent_huge_page_mode",
    "FetchStats",
    "Holder",
    "TensorInfo",
    "VersionInfo",
    "VersionSummary",
    "StatusCode",
    "Error",
    "AbortedError",
    "AlreadyExistsError",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnavailableError",
]
