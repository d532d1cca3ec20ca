"""Worker settings: one set of names for the CLI, the Python API and every
integration (vLLM, verl, SGLang).

A TensorHub worker needs to know where the hub is, how to prove the shared
secret, where its own data plane listens and which address other hosts dial,
its TLS files, where to serve metrics, and where it runs (datacenter, rack,
host). Each setting has one name, used as the config key of every
integration (vLLM's ``init_info``, verl's ``engine_kwargs.tensorhub``,
SGLang's request), as a keyword of :func:`tensorhub.connect`, as a CLI flag
(with dashes) and as an environment variable:

=================  ==============================  =======================
setting            environment variable            CLI flag
=================  ==============================  =======================
hub                TENSORHUB_HUB                   --hub
secret_file        TENSORHUB_SECRET_FILE           --secret-file
(the secret)       TENSORHUB_SECRET                (no flag: the file's)
data_listen        TENSORHUB_DATA_LISTEN           --data-listen
advertise_host     TENSORHUB_ADVERTISE_HOST        --advertise-host
metrics_listen     TENSORHUB_METRICS_LISTEN        --metrics-listen
tls_ca             TENSORHUB_TLS_CA                --tls-ca
tls_cert           TENSORHUB_TLS_CERT              --tls-cert
tls_key            TENSORHUB_TLS_KEY               --tls-key
tls_server_name    TENSORHUB_TLS_SERVER_NAME       --tls-server-name
data_tls           TENSORHUB_DATA_TLS              --data-tls
insecure           TENSORHUB_INSECURE              --insecure
datacenter         TENSORHUB_DATACENTER            --datacenter
rack               TENSORHUB_RACK                  --rack
host_label         TENSORHUB_HOST_LABEL            --host-label
=================  ==============================  =======================

A setting given explicitly wins over the environment, which wins over the
default. ``labels={"datacenter": .., "rack": .., "host": ..}`` is accepted
too (what :func:`tensorhub.connect` always took); ``host_label`` is its
``"host"``.

**The data plane's default address.** Without ``data_listen`` (from either
source), a worker whose hub is on loopback listens on ``127.0.0.1:0`` as
before; a worker whose hub is elsewhere listens on the address of the
interface that routes to the hub (the source address the kernel picks for
it), port 0, and advertises that address, so that readers on other hosts can
dial it. A non-loopback data plane needs the deployment's secret or data TLS
(``secret_file`` / ``TENSORHUB_SECRET`` / ``data_tls``); without either the
worker refuses to start and says so, unless ``insecure``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from .errors import InvalidArgumentError

#: setting -> environment variable (the secret itself: TENSORHUB_SECRET).
ENV: Dict[str, str] = {
    "hub": "TENSORHUB_HUB",
    "secret_file": "TENSORHUB_SECRET_FILE",
    "data_listen": "TENSORHUB_DATA_LISTEN",
    "advertise_host": "TENSORHUB_ADVERTISE_HOST",
    "metrics_listen": "TENSORHUB_METRICS_LISTEN",
    "tls_ca": "TENSORHUB_TLS_CA",
    "tls_cert": "TENSORHUB_TLS_CERT",
    "tls_key": "TENSORHUB_TLS_KEY",
    "tls_server_name": "TENSORHUB_TLS_SERVER_NAME",
    "data_tls": "TENSORHUB_DATA_TLS",
    "insecure": "TENSORHUB_INSECURE",
    "datacenter": "TENSORHUB_DATACENTER",
    "rack": "TENSORHUB_RACK",
    "host_label": "TENSORHUB_HOST_LABEL",
}
SECRET_ENV = "TENSORHUB_SECRET"
DEFAULT_HUB = "127.0.0.1:7070"
_BOOLS = ("data_tls", "insecure")
_LABEL_OF = {"datacenter": "datacenter", "rack": "rack", "host_label": "host"}
#: Every key :func:`worker_settings` takes (the settings, plus labels).
KEYS = tuple(ENV) + ("labels",)


def _bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise InvalidArgumentError(f"{what} must be true or false (1/0, yes/no), not {value!r}")


def read_secret_file(path: str, what: str = "secret_file") -> str:
    """The secret in ``path`` (trailing whitespace removed); a clear error if
    the file cannot be read or is empty."""
    try:
        with open(path, encoding="utf-8") as f:
            secret = f.read().strip()
    except OSError as e:
        raise InvalidArgumentError(f"{what}: cannot read {path!r}: {e}") from None
    if not secret:
        raise InvalidArgumentError(f"{what}: {path!r} is empty")
    return secret


def split_host_port(address: str) -> Tuple[str, int]:
    """('host', port) of 'HOST:PORT' or '[V6]:PORT'."""
    a = address.strip()
    if a.startswith("["):
        host, sep, rest = a[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port = a.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgumentError(f"expected HOST:PORT, not {address!r}")
    return host, int(port)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def route_source_address(hub: str) -> Optional[str]:
    """The local address the kernel would send from to reach ``hub`` (the
    first of a comma-separated HA list that has a route), or None when the
    hub is on loopback. No packet is sent: a UDP socket is connected, which
    only consults the routing table."""
    last: Optional[BaseException] = None
    for addr in [a for a in hub.split(",") if a.strip()]:
        host, port = split_host_port(addr)
        if is_loopback_host(host):
            return None
        try:
            infos = socket.getaddrinfo(host, port or 1, type=socket.SOCK_DGRAM)
        except OSError as e:
            last = e
            continue
        for family, kind, proto, _, sockaddr in infos:
            try:
                with socket.socket(family, kind, proto) as s:
                    s.connect(sockaddr)
                    src = s.getsockname()[0]
            except OSError as e:
                last = e
                continue
            if is_loopback_host(src):
                return None  # the hub's address is this host's own
            return src
    raise InvalidArgumentError(
        f"no route from this host to the hub {hub!r} ({last}); set data_listen "
        f"(${ENV['data_listen']}) to HOST:0 with an address other hosts can reach"
    )


@dataclass(frozen=True)
class WorkerSettings:
    """Resolved settings of one worker (see the module doc)."""

    hub: str = DEFAULT_HUB
    secret: str = ""
    secret_file: str = ""
    data_listen: str = "127.0.0.1:0"
    advertise_host: str = ""
    metrics_listen: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_server_name: str = ""
    data_tls: bool = False
    insecure: bool = False
    labels: Dict[str, str] = field(default_factory=dict)
    #: where data_listen came from: "config", "environment", "route to the
    #: hub" or "default (hub on loopback)"
    data_listen_source: str = "default (hub on loopback)"

    def connect_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of :func:`tensorhub.connect` (with ``hub``)."""
        return {
            "hub": self.hub,
            "labels": dict(self.labels),
            "secret": self.secret,
            "data_listen": self.data_listen,
            "advertise_host": self.advertise_host,
            "metrics_listen": self.metrics_listen or None,
            "tls_ca": self.tls_ca or None,
            "tls_cert": self.tls_cert or None,
            "tls_key": self.tls_key or None,
            "tls_server_name": self.tls_server_name or None,
            "data_tls": self.data_tls,
            "insecure": self.insecure,
        }

    def for_peers(self) -> Dict[str, Any]:
        """The settings another worker of the same deployment shares (hub,
        secret file, TLS files, data TLS), as config keys: what a trainer
        hands its engines. Addresses and labels are each worker's own."""
        out: Dict[str, Any] = {"hub": self.hub}
        for k in ("secret_file", "tls_ca", "tls_cert", "tls_key", "tls_server_name"):
            if getattr(self, k):
                out[k] = getattr(self, k)
        if self.data_tls:
            out["data_tls"] = True
        if self.insecure:
            out["insecure"] = True
        return out


def worker_settings(config: Optional[Mapping[str, Any]] = None, *, what: str = "tensorhub",
                    env: Optional[Mapping[str, str]] = None,
                    secret: Optional[str] = None) -> WorkerSettings:
    """Resolves a worker's settings: ``config`` (keys as in the module doc;
    None values count as unset), then the environment, then the defaults.
    ``secret`` is a secret given directly (it wins over the secret file).

    Raises:
        InvalidArgumentError: an unknown key, a bad value, an unreadable
            secret file, or no route to a non-loopback hub (the message
            names the setting to fix, as ``what: key``).
    """
    env = os.environ if env is None else env
    cfg = {k: v for k, v in dict(config or {}).items() if v is not None}
    unknown = set(cfg) - set(KEYS)
    if unknown:
        raise InvalidArgumentError(
            f"{what}: unknown settings {sorted(unknown)}; known: {sorted(KEYS)}")

    def get(key: str) -> Tuple[Any, str]:
        if key in cfg:
            return cfg[key], "config"
        if env.get(ENV[key]) not in (None, ""):
            return env[ENV[key]], "environment"
        return None, "default"

    out: Dict[str, Any] = {}
    for key in ENV:
        value, _ = get(key)
        if value is None:
            continue
        if key in _BOOLS:
            out[key] = _bool(value, f"{what}: {key}")
        elif not isinstance(value, (str, os.PathLike)):
            raise InvalidArgumentError(f"{what}: {key} must be a string, not {value!r}")
        else:
            out[key] = os.fspath(value)
    hub = out.pop("hub", DEFAULT_HUB)
    for addr in hub.split(","):
        split_host_port(addr)

    labels = cfg.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise InvalidArgumentError(f"{what}: labels must be a dict, not {labels!r}")
    labels = {str(k): str(v) for k, v in labels.items()}
    bad = set(labels) - {"datacenter", "rack", "host"}
    if bad:
        raise InvalidArgumentError(
            f"{what}: unknown label keys {sorted(bad)}; use datacenter, rack, host")
    for key, label in _LABEL_OF.items():
        if key in out:
            labels.setdefault(label, out.pop(key))

    if secret is None:
        secret_file = out.get("secret_file", "")
        secret = (read_secret_file(secret_file, f"{what}: secret_file") if secret_file
                  else env.get(SECRET_ENV, ""))

    listen, source = get("data_listen")
    if listen is None:
        routed = route_source_address(hub)
        if routed is None:
            out["data_listen"], source = "127.0.0.1:0", "default (hub on loopback)"
        else:
            host = f"[{routed}]" if ":" in routed else routed
            out["data_listen"], source = f"{host}:0", "route to the hub"
    else:
        split_host_port(out["data_listen"])
    return WorkerSettings(hub=hub, secret=secret, labels=labels, data_listen_source=source,
                          **out)


__all__ = ["ENV", "KEYS", "SECRET_ENV", "WorkerSettings", "worker_settings",
           "route_source_address", "read_secret_file", "is_loopback_host", "split_host_port"]
