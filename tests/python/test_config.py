"""tensorhub.config: one set of worker settings (config, then environment,
then defaults) and the data plane's default address (the interface that
routes to the hub), through connect() as every integration uses it."""

import socket

import pytest

import tensorhub
from tensorhub import config


def _own_address():
    """A non-loopback IPv4 address of this host, or None."""
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            ip = info[4][0]
            if not ip.startswith("127."):
                return ip
    except OSError:
        pass
    try:  # the source address of a route out, if there is one (nothing is sent)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.1", 1))
            ip = s.getsockname()[0]
            return None if ip.startswith("127.") else ip
    except OSError:
        return None


def test_explicit_beats_environment_beats_default(tmp_path):
    secret = tmp_path / "s"
    secret.write_text("from-file\n")
    env = {"TENSORHUB_HUB": "127.0.0.1:9", "TENSORHUB_DATA_TLS": "yes",
           "TENSORHUB_HOST_LABEL": "envhost", "TENSORHUB_RACK": "r1",
           "TENSORHUB_SECRET_FILE": str(secret), "TENSORHUB_SECRET": "ignored"}
    s = config.worker_settings({"rack": "r2", "labels": {"datacenter": "dc"}}, env=env)
    assert s.hub == "127.0.0.1:9" and s.data_tls is True
    assert s.labels == {"datacenter": "dc", "rack": "r2", "host": "envhost"}
    assert s.secret == "from-file"  # the file wins over the variable
    assert s.data_listen == "127.0.0.1:0" and s.data_listen_source == "default (hub on loopback)"
    s = config.worker_settings({"hub": "127.0.0.1:1", "data_listen": "127.0.0.1:5"}, env={})
    assert (s.data_listen, s.data_listen_source, s.secret) == ("127.0.0.1:5", "config", "")
    # What a trainer hands its engines: shared settings only.
    s = config.worker_settings({"hub": "127.0.0.1:1", "secret_file": str(secret),
                                "tls_ca": "/ca.pem", "host_label": "a"}, env={})
    assert s.for_peers() == {"hub": "127.0.0.1:1", "secret_file": str(secret), "tls_ca": "/ca.pem"}


@pytest.mark.parametrize("cfg, match", [
    ({"data_plane": "x"}, "unknown settings"),
    ({"data_tls": "maybe"}, "data_tls must be true or false"),
    ({"labels": {"zone": "a"}}, "unknown label keys"),
    ({"hub": "nohostport"}, "HOST:PORT"),
    ({"data_listen": "10.0.0.1"}, "HOST:PORT"),
    ({"secret_file": "/nonexistent/secret"}, "secret_file: cannot read"),
])
def test_bad_settings_are_named(cfg, match):
    with pytest.raises(tensorhub.InvalidArgumentError, match=match):
        config.worker_settings(cfg, env={})


def test_route_to_a_hub_on_loopback_is_loopback():
    assert config.route_source_address("127.0.0.1:7070") is None
    assert config.route_source_address("localhost:7070,127.0.0.2:1") is None


def test_a_worker_of_a_remote_hub_serves_on_the_route_to_it(tmp_path):
    ip = _own_address()
    if ip is None:
        pytest.skip("this host has no non-loopback IPv4 address to stand in for another host's hub")
    assert config.route_source_address(f"{ip}:7070") == ip
    with tensorhub.serve_hub(f"{ip}:0", secret="s3cret") as hub:
        # No data_listen: the worker listens where the hub is routed, which
        # needs the secret; without it the error says why and what to set.
        with pytest.raises(tensorhub.FailedPreconditionError,
                           match="routes to the hub.*data_listen='127.0.0.1:0'"):
            tensorhub.connect(hub.address, connect_timeout=5)
        secret = tmp_path / "secret"
        secret.write_text("s3cret\n")
        with tensorhub.connect(hub.address, secret_file=str(secret), connect_timeout=5) as c:
            assert c.data_address.startswith(ip + ":"), c.data_address
        with tensorhub.connect(hub.address, secret="s3cret", data_listen="127.0.0.1:0",
                               connect_timeout=5) as c:
            assert c.data_address.startswith("127.0.0.1:")
