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
tensorhub.torch.
"""

from .client import (
    Client,
    FetchStats,
    Holder,
    TensorInfo,
    VersionInfo,
    VersionSummary,
    connect,
)
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
from .host_memory import HostBuffer, transparent_huge_page_mode
from .hub import Hub, serve_hub

__version__ = "0.1.0"


def set_log_level(level: str) -> None:
    """Sets the C++ library's log level: "debug", "info", "warn" or "error".

    The initial level comes from ``$TENSORHUB_LOG`` (default "info"). Logs go
    to stderr.
    """
    from . import _core

    _core.set_log_level(level)

__all__ = [
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
