"""TensorHub's logging: Python's ``logging``, for the package and the C++ library.

Everything TensorHub logs goes to loggers under ``"tensorhub"``: the Python
modules' own (``tensorhub.client``, ``tensorhub.node``, ...) and
``"tensorhub.native"`` for the C++ library's lines, which carry their C++
file and line as the record's ``filename`` and ``lineno``. Like any library,
TensorHub adds no handler of its own: with logging unconfigured, Python
prints WARNING and above to stderr (its last-resort handler) and nothing at
INFO. To see more::

    logging.basicConfig(level=logging.INFO)                   # everything, or
    logging.getLogger("tensorhub").setLevel(logging.DEBUG)    # TensorHub alone

``$TENSORHUB_LOG`` (``debug|info|warn|error``) is asking too: it sets the
``"tensorhub"`` logger's level and, when neither it nor the root logger has
a handler, adds one that prints to stderr.

The C++ library drops lines below a level of its own before they cost
anything; it follows the ``"tensorhub.native"`` logger's effective level,
read when the native library loads and whenever a client or hub is created,
or set at once with :func:`tensorhub.set_log_level`.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading

logger = logging.getLogger("tensorhub")
native = logging.getLogger("tensorhub.native")

_TO_PY = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}
_NAMES = tuple(_TO_PY)

_lock = threading.Lock()
_core = None  # the native module, once loaded (tensorhub._core)


def _level_name(levelno: int) -> str:
    if levelno <= logging.DEBUG:
        return "debug"
    if levelno <= logging.INFO:
        return "info"
    if levelno <= logging.WARNING:
        return "warn"
    return "error"


def _from_env() -> None:
    """Applies $TENSORHUB_LOG to the "tensorhub" logger (see module doc)."""
    value = os.environ.get("TENSORHUB_LOG", "").strip().lower()
    if not value:
        return
    if value not in _TO_PY:
        logger.warning("TENSORHUB_LOG=%r is not one of debug, info, warn, error: ignored", value)
        return
    logger.setLevel(_TO_PY[value])
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        # The C++ library's stderr format: "I08:31:00.123 PID NAME file.cc:12] ..."
        handler.setFormatter(logging.Formatter(
            "%(levelname).1s%(asctime)s.%(msecs)03d %(process)d %(name)s %(filename)s:%(lineno)d] %(message)s",
            datefmt="%H:%M:%S"))
        logger.addHandler(handler)


def _emit(level: str, filename: str, lineno: int, message: str) -> None:
    """One C++ line, on the forwarding thread (python/src/log_forwarder.h)."""
    levelno = _TO_PY.get(level, logging.INFO)
    if not native.isEnabledFor(levelno):
        return
    record = native.makeRecord(native.name, levelno, filename, lineno, message, None, None)
    native.handle(record)


def sync_level() -> None:
    """Lets the C++ library drop exactly the lines ``tensorhub.native`` would."""
    if _core is not None:
        _core.set_log_level(_level_name(native.getEffectiveLevel()))


def set_level(level: str) -> None:
    """``tensorhub.set_log_level``: the "tensorhub" logger and the C++ library."""
    if level not in _TO_PY:
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(f"log level must be one of {', '.join(_NAMES)}, not {level!r}")
    logger.setLevel(_TO_PY[level])
    sync_level()


def flush(timeout: float = 10.0) -> bool:
    """Waits until every C++ line logged so far has reached ``logging`` (they
    arrive on a thread of their own); False if that took over ``timeout``."""
    if _core is None:
        return True
    return bool(_core._flush_log_forwarding(int(timeout * 1000)))


def attach(core) -> None:
    """Called once the native module is loaded: routes its lines here."""
    global _core
    with _lock:
        if _core is not None:
            return
        _core = core
    sync_level()
    core._start_log_forwarding(_emit)
    # Before the interpreter is finalized: the forwarding thread must not
    # wait for the GIL of an interpreter that is going away.
    atexit.register(core._stop_log_forwarding)


_from_env()
