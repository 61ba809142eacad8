"""The Host rule as a pure function: names are compared, ports are not (behind a port
mapping the client's port is not the one the service listens on); a foreign name or a
malformed port is refused."""

from __future__ import annotations

import pytest

from plumbing.host_guard import host_allowed, local_host_name, split_host

CONFIGURED = frozenset({"sink.internal"})


@pytest.mark.parametrize(
    ("value", "parts"),
    [
        ("sink:8080", ("sink", 8080)),
        ("sink", ("sink", None)),
        ("sink.:80", ("sink.", 80)),
        ("[::1]:80", ("[::1]", 80)),
        ("[::1]", ("[::1]", None)),
        ("127.0.0.1:65535", ("127.0.0.1", 65535)),
    ],
)
def test_split_host(value: str, parts: tuple[str, int | None]) -> None:
    assert split_host(value) == parts


@pytest.mark.parametrize(
    "value",
    [
        "sink:",
        "sink:0",
        "sink:65536",
        "sink:123456",
        "sink:8o",
        "sink:+80",
        "sink:\uff18\uff10",  # full-width digits: str.isdigit() says yes
        "sink:80:81",
        "[::1",
        "[::1]x",
        "[::1]:",
        "[::1]:http",
    ],
)
def test_a_host_with_a_malformed_port_does_not_split(value: str) -> None:
    assert split_host(value) is None


def test_local_host_name() -> None:
    assert local_host_name(("127.0.0.1", 8080)) == "127.0.0.1"
    assert local_host_name(("10.1.2.3", 80)) == "10.1.2.3"
    assert local_host_name(("FE80::1", 8000, 0, 0)) == "[fe80::1]"
    assert local_host_name(("::ffff:10.1.2.3", 8000, 0, 0)) == "10.1.2.3"
    assert local_host_name(None) is None
    assert local_host_name(()) is None


@pytest.mark.parametrize(
    "host",
    [
        # The port a client used through a mapping: docker -p, kubectl port-forward,
        # ssh -L, a TCP proxy.
        "10.1.2.3:18080",
        "10.1.2.3",
        "LOCALHOST:18080",
        "127.0.0.1:1",
        "[::1]:18080",
        "127.0.0.2:8080",
        "sink.internal:18080",
        "Sink.Internal.",
    ],
)
def test_a_name_of_this_service_is_allowed_with_any_port(host: str) -> None:
    assert host_allowed(host, "10.1.2.3", CONFIGURED)


@pytest.mark.parametrize(
    "host",
    [
        "evil.example:8080",
        "evil.example",
        "10.1.2.4:8080",
        "localhost.:8080",
        "localhost.evil.example",
        "127.0.0.1.evil.example:8080",
        "sink.internal.evil.example",
        "10.1.2.3:99999",
        "localhost:abc",
        "",
        ":8080",
    ],
)
def test_a_foreign_name_or_a_malformed_host_is_refused(host: str) -> None:
    assert not host_allowed(host, "10.1.2.3", CONFIGURED)


def test_loopback_names_are_allowed_on_any_local_address() -> None:
    # A loopback name cannot come from a DNS answer: a client on the host running a
    # container sends `localhost:18080`, and `docker run -p` brings it in on the
    # container's own address.
    assert host_allowed("localhost:18080", "172.17.0.2", frozenset())
    assert host_allowed("127.0.0.1:18080", None, frozenset())
    assert not host_allowed("172.17.0.3:8080", "172.17.0.2", frozenset())
