"""Which backend a --db value names: parse_location. Nothing is opened."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from plumbing.storage import BadLocation, Location, parse_location, with_schema


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
        ("what?.db", "what?.db"),  # a question mark, but no parameter
        ("odd?a=b/source.db", "odd?a=b/source.db"),  # ... in a directory's name
    ],
)
def test_a_path_or_a_sqlite_url_names_a_sqlite_file(text: str, target: str) -> None:
    assert parse_location(text) == Location("sqlite", target)


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://app:secret@localhost:5432/outbox",
        "postgres://app:secret@localhost/outbox",
        "postgresql://localhost/outbox?options=-csearch_path%3Dpublisher",
        "postgres:///outbox",
    ],
)
def test_a_postgresql_url_names_that_database_checked_only_when_opened(text: str) -> None:
    assert parse_location(text) == Location("postgres", text)


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


@pytest.mark.parametrize(
    "text", ["source.db?schema=relay", "sqlite:source.db?mode=ro", "sqlite:///x/source.db?a=1&b=2"]
)
def test_parameters_after_a_sqlite_file_are_refused_not_made_part_of_its_name(text: str) -> None:
    with pytest.raises(BadLocation, match="a SQLite file takes no parameters"):
        parse_location(text)


def test_a_file_whose_name_looks_like_parameters_is_taken_when_it_exists(tmp_path: Path) -> None:
    named = tmp_path / "backup?v=2.db"
    named.touch()
    assert parse_location(str(named)) == Location("sqlite", str(named))


def test_a_bad_location_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_location("mysql://localhost/outbox")


def test_a_location_is_frozen() -> None:
    location = parse_location("source.db")
    with pytest.raises(dataclasses.FrozenInstanceError):
        location.target = "other.db"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("postgresql://app:secret@localhost/outbox?prepare=maybe", "prepare must be on or off"),
        ("postgresql://app:secret@localhost/outbox?pool_max=0", "pool_max must be from 1"),
        ("postgresql://app:secret@localhost/outbox?no_such=1", "not a valid PostgreSQL URI"),
        ("postgresql://app:secret@[localhost/outbox", "not a valid PostgreSQL URI"),
        ("postgresql://app:secret@localhost:99999/outbox", "port must be from 1 to 65535"),
        ("postgresql://app:secret@localhost:abc/outbox", "port must be from 1 to 65535"),
        ("postgresql://app:secret@h1:5432,h2:0/outbox", "port must be from 1 to 65535"),
        ("postgresql://app:secret@localhost/outbox?sslmode=bogus", "sslmode must be one of"),
    ],
)
def test_a_bad_postgresql_uri_is_refused_without_connecting_or_echoing_the_password(
    text: str, reason: str
) -> None:
    import pg_tx

    with pytest.raises(BadLocation, match=reason) as excinfo:
        pg_tx.parse(text)
    assert "secret" not in str(excinfo.value)


def test_the_projects_uri_options_are_taken_out_before_libpq_sees_them() -> None:
    import pg_tx

    settings = pg_tx.parse(
        "postgresql://app@localhost/outbox?prepare=off&pool_max=3&options=-csearch_path%3Dpub"
    )
    assert (settings.prepare, settings.pool_max) == (False, 3)
    assert "prepare" not in settings.conninfo and "pool_max" not in settings.conninfo
    assert "options=-csearch_path%3Dpub" in settings.conninfo


def test_libpq_parameters_reach_libpq_as_written() -> None:
    import psycopg.conninfo

    import pg_tx

    settings = pg_tx.parse(
        "postgresql://app@localhost/outbox?options=-c%20statement_timeout%3D5s"
        "&application_name=a+b&schema=pub"
    )
    given = psycopg.conninfo.conninfo_to_dict(settings.conninfo)
    assert given["options"] == "-c statement_timeout=5s"
    assert given["application_name"] == "a+b"  # libpq keeps a + as it is
    assert settings.schema == "pub" and "schema" not in given


def test_a_parameter_of_the_projects_given_twice_is_refused() -> None:
    import pg_tx

    with pytest.raises(BadLocation, match="deadline is given twice"):
        pg_tx.parse("postgresql://app@localhost/outbox?deadline=1&deadline=2")


@pytest.mark.parametrize(
    "text",
    ["postgresql:///outbox", "postgresql:///outbox?host=127.0.0.1&port=5433&deadline=2"],
)
def test_a_uri_with_an_empty_host_keeps_it_for_libpq(text: str) -> None:
    # libpq reads postgresql:///db as its local socket; without the "//" it refuses it.
    import psycopg.conninfo

    import pg_tx

    settings = pg_tx.parse(with_schema(text, "pub"))
    assert settings.conninfo.startswith("postgresql:///outbox")
    assert psycopg.conninfo.conninfo_to_dict(settings.conninfo)["dbname"] == "outbox"
    assert settings.schema == "pub"
