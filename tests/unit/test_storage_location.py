"""Which backend a --db value names: parse_location. Pure: nothing is opened."""

from __future__ import annotations

import dataclasses

import pytest

from plumbing.storage import BadLocation, Location, parse_location


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("source.db", "source.db"),
        ("./data/source.db", "./data/source.db"),
        ("/var/lib/outbox/source.db", "/var/lib/outbox/source.db"),
        ("data:1.db", "data:1.db"),  # a colon without "//" is part of a file name
        ("sqlite:source.db", "source.db"),
        ("sqlite:data/source.db", "data/source.db"),
        ("sqlite:/var/lib/outbox/source.db", "/var/lib/outbox/source.db"),
        ("sqlite:///var/lib/outbox/source.db", "/var/lib/outbox/source.db"),
        ("sqlite:///source.db", "/source.db"),
    ],
)
def test_a_path_or_a_sqlite_url_names_a_sqlite_file(text: str, target: str) -> None:
    assert parse_location(text) == Location("sqlite", target)


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://app:secret@localhost:5432/outbox",
        "postgres://app:secret@localhost/outbox",
    ],
)
def test_postgresql_is_refused_as_not_supported_by_this_version(text: str) -> None:
    with pytest.raises(BadLocation, match="PostgreSQL is not supported") as excinfo:
        parse_location(text)
    assert "secret" not in str(excinfo.value)


@pytest.mark.parametrize(
    ("text", "scheme"),
    [
        ("mysql://app:secret@localhost/outbox", "mysql://"),
        ("file:///var/lib/outbox/source.db", "file://"),
        ("http://localhost/source.db", "http://"),
        ("postgresql+asyncpg://localhost/outbox", "postgresql+asyncpg://"),
    ],
)
def test_another_url_scheme_is_refused_by_name(text: str, scheme: str) -> None:
    with pytest.raises(BadLocation, match="unknown database URL scheme") as excinfo:
        parse_location(text)
    assert repr(scheme) in str(excinfo.value)
    assert "secret" not in str(excinfo.value)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("sqlite://host/source.db", "names no host"),
        ("sqlite://localhost/source.db", "names no host"),
        ("sqlite:", "names no file"),
        ("sqlite://", "names no file"),
        ("", "empty"),
    ],
)
def test_a_sqlite_url_with_a_host_or_without_a_file_and_an_empty_value_are_refused(
    text: str, reason: str
) -> None:
    with pytest.raises(BadLocation, match=reason):
        parse_location(text)


def test_a_bad_location_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_location("mysql://localhost/outbox")


def test_a_location_is_frozen() -> None:
    location = parse_location("source.db")
    with pytest.raises(dataclasses.FrozenInstanceError):
        location.target = "other.db"  # type: ignore[misc]
