"""An embedded hub, for tests, examples and single-machine setups."""

from __future__ import annotations

import os
from typing import Any, Optional, Union

from . import _log
from ._native import core as _core
from .client import _path
from .errors import InvalidArgumentError


class Hub:
    """A hub running inside this process. Create it with :func:`serve_hub`.

    The hub only schedules: it tracks which worker holds which version and
    never touches tensor bytes, so it is cheap to run beside a trainer.
    Clients in this or other processes connect to :attr:`address`.
    """

    def __init__(self, core: Any) -> None:
        self._core = core

    @property
    def address(self) -> str:
        """HOST:PORT the hub listens on (the real port if 0 was asked for)."""
        return self._core.address

    @property
    def metrics_address(self) -> Optional[str]:
        """HOST:PORT of the hub's Prometheus endpoint (GET /metrics), or None
        without ``serve_hub(..., metrics_listen=...)``."""
        return self._core.metrics_address or None

    @property
    def closed(self) -> bool:
        return self._core.closed

    def close(self) -> None:
        """Stops accepting calls, finishes calls in flight, returns; idempotent."""
        self._core.close()

    def __enter__(self) -> "Hub":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<tensorhub.Hub {'closed' if self.closed else self.address}>"

    def __getstate__(self) -> Any:
        raise TypeError("a tensorhub.Hub cannot be pickled; pass hub.address instead")


def serve_hub(
    listen: str = "127.0.0.1:0",
    lease_ms: int = 5000,
    secret: Optional[str] = None,
    keep_latest: int = 0,
    oversubscribed_racks: bool = False,
    rebuild_ms: Optional[int] = None,
    metrics_listen: Optional[str] = None,
    tls_cert: Optional[Union[str, os.PathLike]] = None,
    tls_key: Optional[Union[str, os.PathLike]] = None,
    tls_client_ca: Optional[Union[str, os.PathLike]] = None,
    insecure: bool = False,
    heartbeat_budget: int = 500,
    max_lease_ms: int = 60000,
) -> Hub:
    """Starts a hub in this process and returns once it accepts calls.

    Args:
        listen: HOST:PORT to bind; port 0 picks a free port (see ``.address``).
        lease_ms: a worker that sends no heartbeat for this long is dropped
            and its references with it.
        secret: shared secret that clients must present (default: none).
        keep_latest: retain the latest K committed versions of every model
            (0: only versions pinned with :meth:`Client.retain`).
        oversubscribed_racks: rack uplinks are the bottleneck: readers then
            prefer a busy holder in their rack to an idle one in another
            rack (``tensorhub serve --oversubscribed-racks``). Leave False on
            a full-bisection fabric.
        rebuild_ms: for this long after it starts, the hub answers a version
            it does not know (or knows with no complete holder) as
            UNAVAILABLE, "rebuilding", which fetches retry within their
            timeout, rather than NOT_FOUND: a restarted hub learns versions
            from the workers' reports within about a lease. None: the lease
            the hub currently grants (``lease_ms``, or longer for a large
            fleet: ``heartbeat_budget``); 0: answer from its table at once.
        metrics_listen: HOST:PORT to serve the hub's Prometheus metrics on
            (GET /metrics; port 0 picks a free port, see
            :attr:`Hub.metrics_address`). None: no endpoint
            (``tensorhub serve --metrics-listen``).
        tls_cert, tls_key: PEM files of the hub's certificate and key: the
            hub then accepts only TLS connections (clients need ``tls_ca``).
        tls_client_ca: with them, require every client to present a
            certificate signed by this CA (mutual TLS). See docs/security.md.

        heartbeat_budget: the most heartbeats a second the hub plans for:
            a fleet that would send more is told a longer heartbeat interval
            and granted a longer lease (three intervals), up to
            ``max_lease_ms`` (``tensorhub serve --heartbeat-budget``,
            docs/design.md "Heartbeats"). 0: every worker gets ``lease_ms``.
        max_lease_ms: the longest lease the budget may grant.
        insecure: accept a non-loopback ``listen`` with neither ``secret``
            nor TLS (a private test network); the hub then logs what anyone
            who can reach it can do. Without it such a hub refuses to start.

    Raises:
        UnavailableError / InvalidArgumentError: the address cannot be bound.
        InvalidArgumentError: a TLS file is missing, unreadable or does not
            match (the message names it).
        FailedPreconditionError: a non-loopback ``listen`` with neither
            ``secret`` nor TLS, without ``insecure=True`` (the message says
            what that would expose and how to fix it).
    """
    if not isinstance(insecure, bool):
        raise InvalidArgumentError(f"insecure must be a bool, not {insecure!r}")
    for name, value, low, top in (("heartbeat_budget", heartbeat_budget, 0, 1_000_000),
                                  ("max_lease_ms", max_lease_ms, 100, 3_600_000)):
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= top:
            raise InvalidArgumentError(
                f"{name} must be an integer in [{low}, {top}], not {value!r}")
    if not isinstance(keep_latest, int) or not 0 <= keep_latest <= 1024:
        raise InvalidArgumentError(f"keep_latest must be an integer in [0, 1024], not {keep_latest!r}")
    if not isinstance(oversubscribed_racks, bool):
        raise InvalidArgumentError(
            f"oversubscribed_racks must be a bool, not {oversubscribed_racks!r}"
        )
    if rebuild_ms is not None and (
        not isinstance(rebuild_ms, int) or isinstance(rebuild_ms, bool)
        or not 0 <= rebuild_ms <= 3600000
    ):
        raise InvalidArgumentError(
            f"rebuild_ms must be None or an integer in [0, 3600000], not {rebuild_ms!r}"
        )
    if metrics_listen is not None and (not isinstance(metrics_listen, str) or not metrics_listen):
        raise InvalidArgumentError(
            f"metrics_listen must be 'HOST:PORT' or None, not {metrics_listen!r}"
        )
    _log.sync_level()
    return Hub(
        _core.Hub.start(
            listen=listen,
            lease_ms=int(lease_ms),
            secret=secret or "",
            keep_latest=keep_latest,
            oversubscribed_racks=oversubscribed_racks,
            rebuild_ms=-1 if rebuild_ms is None else rebuild_ms,
            metrics_listen=metrics_listen or "",
            tls_cert=_path(tls_cert, "tls_cert"),
            tls_key=_path(tls_key, "tls_key"),
            tls_client_ca=_path(tls_client_ca, "tls_client_ca"),
            insecure=insecure,
            heartbeat_budget_per_s=heartbeat_budget,
            max_lease_ms=max_lease_ms,
        )
    )
