"""Which sink URLs the publisher may send to: check_target. Pure, no network traffic."""

from __future__ import annotations

import pytest
from yarl import URL

from publisher.errors import DeliveryError, TargetNotAllowed
from publisher.targets import EVENTS_PATH, check_target, is_loopback


def refused(url: object, allowed_hosts: tuple[str, ...] = ()) -> TargetNotAllowed:
    with pytest.raises(TargetNotAllowed) as excinfo:
        check_target(url, allowed_hosts)  # type: ignore[arg-type]
    return excinfo.value


def test_target_not_allowed_is_a_delivery_error_that_is_not_retryable() -> None:
    assert issubclass(TargetNotAllowed, DeliveryError)
    assert TargetNotAllowed("x").retryable is False


# ---------------------------------------------------------------- allowed by default


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/events",
        "http://127.0.0.1:1/events",
        "http://127.0.0.1/events",
        "http://127.5.6.7/events",
        "http://127.255.255.254:9000/events",
        "http://[::1]:8080/events",
        "http://[::1]/events",
        "http://localhost:8080/events",
        "http://LOCALHOST:8080/events",
    ],
)
def test_plain_http_to_loopback_on_events_is_allowed(url: str) -> None:
    target = check_target(url)
    assert isinstance(target, URL)
    assert target.scheme == "http"
    assert target.path == "/events"


def test_the_returned_url_keeps_host_and_port() -> None:
    target = check_target("http://127.0.0.1:8765/events")
    assert (target.host, target.port) == ("127.0.0.1", 8765)


def test_a_yarl_url_is_accepted_as_input() -> None:
    assert check_target(URL("http://127.0.0.1:8080/events")) == URL("http://127.0.0.1:8080/events")


# ---------------------------------------------------------------- refused by default


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1:8443/events",
        "https://localhost/events",
        "https://[::1]/events",
    ],
)
def test_https_to_loopback_is_refused_by_default(url: str) -> None:
    refused(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/events",
        "http://example.com:80/events",
        "http://10.0.0.1/events",
        "http://192.168.1.1:8080/events",
        "http://0.0.0.0:8080/events",
        "http://[::]:8080/events",
        "http://128.0.0.1/events",
        "http://126.255.255.255/events",
        "http://[::2]/events",
        "http://localhost.example.com/events",
        "http://sink/events",
    ],
)
def test_hosts_that_are_not_loopback_are_refused(url: str) -> None:
    refused(url)


@pytest.mark.parametrize(
    "path", ["/events?x=1", "/outbox/events?x=1", "/events#top", "/outbox/events#top"]
)
def test_a_query_or_a_fragment_is_refused_on_any_path(path: str) -> None:
    assert "query" in str(refused(f"http://127.0.0.1:8080{path}"))


@pytest.mark.parametrize("path", ["/events/", "/outbox/events/", "/outbox/"])
def test_a_trailing_slash_is_refused_and_the_message_says_so(path: str) -> None:
    message = str(refused(f"http://127.0.0.1:8080{path}"))
    assert "trailing slash" in message
    assert path in message


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8080", "http://127.0.0.1:8080/", "http://127.0.0.1:8080//"]
)
def test_a_url_without_a_path_is_refused_and_the_message_names_one(url: str) -> None:
    assert "/events" in str(refused(url))


# ---------------------------------------------------------------- any path the user gives


@pytest.mark.parametrize(
    "path",
    [
        "/outbox/events",
        "/api/v1/events",
        "/other",
        "/Events",
        "/inbox",
        "/a%2Fb/events",
    ],
)
def test_any_absolute_path_without_a_trailing_slash_is_allowed(path: str) -> None:
    target = check_target(f"http://127.0.0.1:8080{path}")
    assert target.raw_path == path
    assert str(target) == f"http://127.0.0.1:8080{path}"


def test_a_sink_mounted_under_a_prefix_gets_its_batch_and_lookups_under_it() -> None:
    # The sender joins "batch" and an event ID below the checked URL.
    target = check_target("http://127.0.0.1:8080/outbox/events")
    assert str(target / "batch") == "http://127.0.0.1:8080/outbox/events/batch"
    assert str(target / "order-1") == "http://127.0.0.1:8080/outbox/events/order-1"


def test_events_path_is_the_default_path_name() -> None:
    assert EVENTS_PATH == "/events"
    assert check_target(f"http://127.0.0.1:8080{EVENTS_PATH}").path == EVENTS_PATH


@pytest.mark.parametrize(
    "url",
    [
        "http://user@127.0.0.1:8080/events",
        "http://user:secret@127.0.0.1:8080/events",
        "http://:secret@localhost:8080/events",
    ],
)
def test_credentials_in_the_url_are_refused(url: str) -> None:
    refused(url)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://127.0.0.1/events",
        "ws://127.0.0.1:8080/events",
        "file:///events",
        "unix:///tmp/sink.sock",
    ],
)
def test_other_schemes_are_refused(url: str) -> None:
    refused(url)


@pytest.mark.parametrize(
    "url",
    [
        "/events",
        "events",
        "127.0.0.1:8080/events",
        "//127.0.0.1:8080/events",
        "",
        "not a url",
        "http://",
        "http:///events",
        "http://[::1/events",
        "http://127.0.0.1:99999/events",
    ],
)
def test_relative_or_garbage_urls_are_refused(url: str) -> None:
    refused(url)


@pytest.mark.parametrize("url", [None, 8080, b"http://127.0.0.1/events"])
def test_values_that_are_not_urls_are_refused(url: object) -> None:
    refused(url)


# ---------------------------------------------------------------- explicitly allowed hosts


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_an_explicitly_allowed_host_is_accepted_over_http_and_https(scheme: str) -> None:
    target = check_target(f"{scheme}://sink:8080/events", ["sink"])
    assert (target.scheme, target.host) == (scheme, "sink")


def test_allowed_hosts_match_case_insensitively() -> None:
    assert check_target("https://SINK/events", ["Sink"]).host == "sink"


def test_an_allowed_host_may_use_any_path() -> None:
    assert check_target("https://sink/outbox/events", ["sink"]).path == "/outbox/events"


@pytest.mark.parametrize("path", ["/outbox/events/", "/events?x=1", "/events#top", "/"])
def test_an_allowed_host_still_refuses_a_trailing_slash_query_or_fragment(path: str) -> None:
    refused(f"https://sink{path}", ("sink",))


def test_an_allowed_host_still_refuses_other_schemes() -> None:
    refused("ftp://sink/events", ("sink",))


def test_an_allowed_host_still_refuses_credentials() -> None:
    refused("https://user:pw@sink/events", ("sink",))


def test_allowing_one_host_does_not_allow_another() -> None:
    refused("https://warehouse/events", ("sink",))
    refused("http://sink.example.com/events", ("sink",))


def test_allowing_a_host_does_not_open_https_to_other_loopback_hosts() -> None:
    refused("https://127.0.0.1/events", ("sink",))


def test_a_loopback_host_named_explicitly_may_use_https() -> None:
    assert check_target("https://127.0.0.1:8443/events", ["127.0.0.1"]).scheme == "https"


# ---------------------------------------------------------------- is_loopback


@pytest.mark.parametrize(
    "host", ["localhost", "LocalHost", "127.0.0.1", "127.9.9.9", "::1", "[::1]"]
)
def test_is_loopback_true(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["example.com", "10.0.0.1", "0.0.0.0", "::", "", "localhost."])
def test_is_loopback_false(host: str) -> None:
    assert not is_loopback(host)
