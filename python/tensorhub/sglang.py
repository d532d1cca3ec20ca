"""SGLang: a custom weight loader that loads a version from TensorHub.

SGLang calls a custom loader as ``fn(model, named_tensors)`` in every TP
rank, for ``update_weights_from_tensor(..., load_format="pkg.fn")`` once the
server was started with ``--custom-weight-loader pkg.fn``. Here the
"tensors" sent through SGLang are only a small request (hub, model,
version) encoded as one uint8 tensor; the weights themselves come from
TensorHub, peer to peer::

    # server
    python -m sglang.launch_server ... --custom-weight-loader tensorhub.sglang.load_weights

    # trainer, an in-process sglang.Engine
    import tensorhub.sglang
    tensorhub.sglang.update(engine, "policy", 7, hub="10.0.0.1:7070")

    # trainer, a server over HTTP (the update_weights_from_* routes)
    tensorhub.sglang.http_update("http://10.0.0.2:30000", "policy", 7, hub="10.0.0.1:7070",
                                 tp_size=2)

Both open SGLang's weight-update session around the load
(``begin_weight_update`` / ``end_weight_update``: SGLang 0.5.23 refuses
``update_weights_from_tensor`` outside one, and restores in-place
quantized or repacked weights at its start and re-processes them at its
end, so a quantized model loads the new bytes correctly), and call
``update_weights_from_tensor`` with ``load_format=LOADER`` and the small
request of :func:`request` as the named tensors. Over HTTP the request
travels pickled by value (base64), which SGLang's restricted unpickler
accepts, so the server may be on any host.

Each rank fetches the version (with "latest", the ranks agree through a
reader group named in the request), calls ``model.load_weights`` with the
tensors by their Hugging Face names, and then holds and serves them to
other workers until the next version replaces them. A failed fetch raises
before ``load_weights`` runs, so the model keeps its weights.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .client import Client, connect
from .errors import FailedPreconditionError, InvalidArgumentError

#: The value for SGLang's --custom-weight-loader and load_format.
LOADER = "tensorhub.sglang.load_weights"
#: The name of the request tensor in named_tensors.
REQUEST_NAME = "__tensorhub_request__"
# The worker settings of tensorhub.config, by the names every integration uses
# (each also read from its TENSORHUB_* variable in the SGLang rank's environment).
_SETTINGS = ("secret_file", "data_listen", "advertise_host", "metrics_listen", "tls_ca",
             "tls_cert", "tls_key", "tls_server_name", "data_tls", "insecure", "datacenter",
             "rack", "host_label", "labels")
_FIELDS = {"hub", "model", "version", "timeout_s", "group", "step", "connections", *_SETTINGS}

_lock = threading.Lock()
_clients: Dict[str, Client] = {}  # by the settings they were made with
# (hub, model) -> (version, tensors) this process holds and serves.
_held: Dict[Tuple[str, str], Tuple[int, Dict[str, Any]]] = {}
last_stats: Dict[str, Any] = {}


def request(
    model: str,
    version: Any = "latest",
    hub: Optional[str] = None,
    *,
    secret_file: Optional[str] = None,
    timeout_s: float = 120.0,
    connections: int = 4,
    **settings: Any,
) -> List[Tuple[str, Any]]:
    """The ``named_tensors`` to pass to SGLang's ``update_weights_from_tensor``.

    ``hub`` defaults to ``$TENSORHUB_HUB`` as seen by the SGLang ranks. With
    ``version="latest"`` the request names a fresh reader group, so all TP
    ranks load the same version. ``settings`` are worker settings of
    :mod:`tensorhub.config` (``data_listen``, ``advertise_host``,
    ``tls_ca``, ``datacenter``, ...) for the ranks' clients; each defaults
    to its ``TENSORHUB_*`` variable in the SGLang ranks' environment.
    """
    import torch

    if not isinstance(model, str) or not model:
        raise InvalidArgumentError(f"model must be a non-empty string, not {model!r}")
    if version != "latest" and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise InvalidArgumentError(f'version must be an integer >= 1 or "latest", not {version!r}')
    req: Dict[str, Any] = {"model": model, "version": version, "timeout_s": float(timeout_s),
                           "connections": int(connections)}
    if hub:
        req["hub"] = hub
    if secret_file:
        req["secret_file"] = secret_file
    unknown = set(settings) - set(_SETTINGS)
    if unknown:
        raise InvalidArgumentError(f"unknown settings {sorted(unknown)}; known: {list(_SETTINGS)}")
    req.update({k: v for k, v in settings.items() if v is not None})
    if version == "latest":
        req["group"] = f"sglang-{uuid.uuid4().hex[:12]}"
        req["step"] = 1
    raw = json.dumps(req, sort_keys=True).encode()
    return [(REQUEST_NAME, torch.frombuffer(bytearray(raw), dtype=torch.uint8))]


def _parse(named_tensors: Iterable[Tuple[str, Any]]) -> Dict[str, Any]:
    items = list(named_tensors)
    if len(items) != 1 or items[0][0] != REQUEST_NAME:
        names = [n for n, _ in items][:5]
        raise InvalidArgumentError(
            f"{LOADER} expects the named_tensors of tensorhub.sglang.request(...), got {names}"
        )
    t = items[0][1]
    try:
        req = json.loads(bytes(t.detach().cpu().numpy().tobytes()).decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidArgumentError(f"{LOADER}: malformed request tensor: {e}") from None
    unknown = set(req) - _FIELDS
    if unknown or "model" not in req:
        raise InvalidArgumentError(f"{LOADER}: bad request fields {sorted(req)}")
    req.setdefault("hub", os.environ.get("TENSORHUB_HUB", ""))
    if not req["hub"]:
        raise InvalidArgumentError(f"{LOADER}: no hub in the request and $TENSORHUB_HUB is not set")
    return req


def _client(req: Dict[str, Any]) -> Client:
    from . import config

    cfg = {"hub": req["hub"], **{k: req[k] for k in _SETTINGS if k in req}}
    key = json.dumps(cfg, sort_keys=True)
    with _lock:
        c = _clients.get(key)
        if c is None or c.closed:
            s = config.worker_settings(cfg, what=LOADER)
            c = connect(worker_id=f"sglang-{os.getpid()}", **s.connect_kwargs())
            _clients[key] = c
        return c


def load_weights(model: Any, named_tensors: Iterable[Tuple[str, Any]]) -> None:
    """SGLang custom weight loader: fetch the requested version, load it."""
    from .torch import ALIASES_KEY

    req = _parse(named_tensors)
    if not callable(getattr(model, "load_weights", None)):
        raise InvalidArgumentError(f"{LOADER}: {type(model).__name__} has no load_weights(weights)")
    c = _client(req)
    name, timeout_s = req["model"], float(req.get("timeout_s", 120.0))
    t0 = time.monotonic()
    info = c.describe(name, req["version"], group=req.get("group"), step=int(req.get("step", 0)))
    if not info.committed:
        raise FailedPreconditionError(f"{LOADER}: {name}@{info.version} is {info.state}")
    key = (req["hub"], name)
    with _lock:
        held = _held.get(key)
    if held is not None and held[0] == info.version:
        out, stats = held[1], None  # this process holds (and serves) it already
    else:
        # Served onward (serve=True), also a version several trainer ranks
        # published in pieces (then as a holder of slices).
        out = info.empty("torch")
        stats = c.fetch(name, info.version, into=out, timeout=timeout_s,
                        connections=int(req.get("connections", 4)), return_stats=True)
    t1 = time.monotonic()
    raw = info.metadata.get(ALIASES_KEY, "{}")
    aliases = json.loads(raw) if isinstance(raw, str) else {}
    weights = list(out.items()) + [(a, out[n]) for a, n in aliases.items()]
    model.load_weights(weights)
    with _lock:
        old = _held.get(key)
        _held[key] = (info.version, out)
    if old is not None and old[0] != info.version:
        c.unpublish(name, old[0], timeout=timeout_s)
    last_stats.clear()
    last_stats.update(version=info.version, fetch_seconds=t1 - t0,
                      load_seconds=time.monotonic() - t1, fetch=stats)


def update(engine: Any, model: str, version: Any = "latest", hub: Optional[str] = None, *,
           weight_version: Optional[str] = None, flush_cache: bool = True,
           **request_kwargs: Any) -> Any:
    """Loads ``model@version`` into an in-process ``sglang.Engine`` through
    this loader, inside SGLang's weight-update session (see the module
    doc). Returns what ``update_weights_from_tensor`` returned."""
    named = request(model, version, hub, **request_kwargs)
    begin = getattr(engine, "begin_weight_update", None)
    end = getattr(engine, "end_weight_update", None)
    if callable(begin):
        begin()
    try:
        kwargs: Dict[str, Any] = {"named_tensors": named, "load_format": LOADER,
                                  "flush_cache": flush_cache}
        if weight_version is not None:
            kwargs["weight_version"] = weight_version
        return engine.update_weights_from_tensor(**kwargs)
    finally:
        if callable(end):
            end()


def http_payload(named_tensors: List[Tuple[str, Any]]) -> str:
    """``named_tensors`` for SGLang's HTTP ``update_weights_from_tensor``:
    pickled by value (the tensor's bytes inside, not a shared-memory handle
    as SGLang's own MultiprocessingSerializer makes for a CPU tensor, which
    only a process on the same host can open), base64. SGLang's
    SafeUnpickler rebuilds it (``torch._utils._rebuild_tensor_v2``,
    ``torch.storage._load_from_bytes``)."""
    import base64
    import pickle

    return base64.b64encode(pickle.dumps(list(named_tensors), protocol=4)).decode("ascii")


def http_update(url: str, model: str, version: Any = "latest", hub: Optional[str] = None, *,
                tp_size: int = 1, api_key: Optional[str] = None,
                weight_version: Optional[str] = None, flush_cache: bool = True,
                http_timeout_s: float = 600.0, **request_kwargs: Any) -> Dict[str, Any]:
    """Loads ``model@version`` into the SGLang server at ``url`` over its
    HTTP routes: ``/begin_weight_update``, ``/update_weights_from_tensor``
    (one copy of the request per TP rank: ``tp_size``), then
    ``/end_weight_update`` (also after a failed load, so the session does
    not stay open). Returns the update's JSON answer.

    Raises:
        InvalidArgumentError: bad arguments (nothing was sent).
        FailedPreconditionError: the server refused a step; the message has
            its answer.
    """
    import json as _json
    import urllib.error
    import urllib.request

    if not isinstance(tp_size, int) or tp_size < 1:
        raise InvalidArgumentError(f"tp_size must be an integer >= 1, not {tp_size!r}")
    payload = http_payload(request(model, version, hub, **request_kwargs))
    base = url.rstrip("/")

    def post(route: str, body: Dict[str, Any]) -> Dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        req = urllib.request.Request(f"{base}/{route}", data=_json.dumps(body).encode(),
                                     headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=http_timeout_s) as r:
                answer = r.read()
        except urllib.error.HTTPError as e:
            raise FailedPreconditionError(
                f"SGLang {base}/{route} answered {e.code}: {e.read()[:2000]!r}") from None
        try:
            return _json.loads(answer) if answer else {}
        except ValueError:
            return {"raw": answer[:2000].decode(errors="replace")}

    post("begin_weight_update", {})
    try:
        body: Dict[str, Any] = {"serialized_named_tensors": [payload] * tp_size,
                                "load_format": LOADER, "flush_cache": flush_cache}
        if weight_version is not None:
            body["weight_version"] = weight_version
        return post("update_weights_from_tensor", body)
    finally:
        post("end_weight_update", {})


def close() -> None:
    """Closes this process's TensorHub clients (stops serving held versions)."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
        _held.clear()
    for c in clients:
        c.close()


__all__ = ["LOADER", "REQUEST_NAME", "request", "load_weights", "update", "http_update",
           "http_payload", "close", "last_stats"]
