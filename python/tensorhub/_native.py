"""Loads the native library (tensorhub._core) and routes its log lines.

Every module of the package that needs the C++ library imports it from
here, so that the first one to do so also hands its logging to Python's
(tensorhub._log). Importing ``tensorhub`` itself, or ``tensorhub.vllm`` (the
vLLM plugin entry point), loads nothing native.
"""

from . import _core as core
from . import _log

_log.attach(core)

__all__ = ["core"]
