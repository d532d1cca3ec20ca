"""Exceptions raised by tensorhub.

Every failure reported by the C++ library carries a canonical status code;
the binding raises the subclass of :class:`Error` that matches it. Each
exception has ``.code`` (the integer code, see :class:`StatusCode`),
``.code_name`` (``"NOT_FOUND"``, ...) and ``.message`` (the library's text).

What to do about each (mirrors ``include/tensorhub/status.h``):

=========================  =================================================
InvalidArgumentError       the call itself is wrong; retrying fails the same
DeadlineExceededError      a deadline passed; retry with a longer timeout
NotFoundError              no such model, version, worker or registration
AlreadyExistsError         e.g. the same rank published twice
PermissionDeniedError      the shared secret was wrong or missing
ResourceExhaustedError     a bound was hit (connections, bytes in flight)
FailedPreconditionError    wrong state: version not committed yet, version
                           number not increasing, memory still published
AbortedError               the version was aborted while the call ran
InternalError              a bug inside TensorHub
UnavailableError           hub unreachable or no live holder; retry later
DataLossError              a checksum did not match
=========================  =================================================

Some classes also derive from the matching Python built-in, so generic code
keeps working: ``InvalidArgumentError`` is a ``ValueError``,
``DeadlineExceededError`` a ``TimeoutError``, ``NotFoundError`` a
``LookupError``, ``PermissionDeniedError`` a ``PermissionError`` and
``UnavailableError`` a ``ConnectionError``.
"""

from __future__ import annotations

import enum
from typing import Dict, Type


class StatusCode(enum.IntEnum):
    """The canonical status codes of the C++ library (same numbers)."""

    OK = 0
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15


class Error(Exception):
    """Base class of every error tensorhub raises for a failed operation.

    Attributes:
        code: the :class:`StatusCode` of the failure.
        code_name: its name, e.g. ``"NOT_FOUND"``.
        message: the library's explanation, without the code.
    """

    #: The code this class stands for (set on each subclass).
    status_code: StatusCode = StatusCode.INTERNAL

    def __init__(self, message: str, code: int | None = None) -> None:
        code = self.status_code if code is None else code
        try:
            self.code: StatusCode | int = StatusCode(code)
            self.code_name: str = StatusCode(code).name
        except ValueError:
            self.code = code
            self.code_name = f"CODE_{code}"
        self.message: str = message
        super().__init__(f"{self.code_name}: {message}")

    def __reduce__(self):  # picklable, e.g. across multiprocessing queues
        return (type(self), (self.message, int(self.code)))


class InvalidArgumentError(Error, ValueError):
    """The caller passed something wrong: shape, dtype, layout, version."""

    status_code = StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(Error, TimeoutError):
    """A deadline passed before the work finished."""

    status_code = StatusCode.DEADLINE_EXCEEDED


class NotFoundError(Error, LookupError):
    """The model, version, worker or registration does not exist."""

    status_code = StatusCode.NOT_FOUND


class AlreadyExistsError(Error):
    """The thing being created exists already (e.g. a rank published twice)."""

    status_code = StatusCode.ALREADY_EXISTS


class PermissionDeniedError(Error, PermissionError):
    """A shared secret was wrong or missing."""

    status_code = StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(Error):
    """A bound was hit (connections, reads in flight, bytes)."""

    status_code = StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(Error):
    """The system is not in a state where the call can succeed.

    E.g. fetching a version that is not committed yet, publishing a version
    number that is not greater than the last, or publishing memory that is
    still published. Retry only after the state changed.
    """

    status_code = StatusCode.FAILED_PRECONDITION


class AbortedError(Error):
    """The version was aborted or the registration revoked while the call ran."""

    status_code = StatusCode.ABORTED


class InternalError(Error):
    """A bug or a broken invariant inside TensorHub."""

    status_code = StatusCode.INTERNAL


class UnavailableError(Error, ConnectionError):
    """Nobody can serve the request now (hub unreachable, no live holder)."""

    status_code = StatusCode.UNAVAILABLE


class DataLossError(Error):
    """Bytes were damaged: a checksum did not match."""

    status_code = StatusCode.DATA_LOSS


_BY_CODE: Dict[int, Type[Error]] = {
    cls.status_code.value: cls
    for cls in (
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        AbortedError,
        InternalError,
        UnavailableError,
        DataLossError,
    )
}


def error_class(code: int) -> Type[Error]:
    """The exception class raised for status code ``code``."""
    return _BY_CODE.get(int(code), Error)


def _from_status(code: int, code_name: str, message: str) -> Error:
    """Called by the C++ binding to build the exception for a failed Status."""
    cls = _BY_CODE.get(int(code))
    if cls is None:
        err = Error(message, code)
        err.code_name = code_name
        return err
    return cls(message, code)


__all__ = [
    "StatusCode",
    "Error",
    "InvalidArgumentError",
    "DeadlineExceededError",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "AbortedError",
    "InternalError",
    "UnavailableError",
    "DataLossError",
    "error_class",
]
