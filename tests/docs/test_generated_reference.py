"""The generated reference pages (docsgen) say what the code says: they match it now,
a stale one is named, and what the code adds (an option, a metric, a table, a route)
shows on its page."""

from __future__ import annotations

import argparse
import copy
import re
from pathlib import Path

import pytest

import docsgen.pages
import publisher
import shared
import sink
from docsgen import cli_model, cli_pages, configuration, database, http_pages, metrics
from docsgen.__main__ import main
from pg_tx import settings as pg_settings
from plumbing.cli import add_option
from plumbing.openapi import load_document
from sink.cli import build_parser as sink_parser

ROOT = Path(__file__).resolve().parents[2]


def test_every_generated_page_matches_the_code() -> None:
    stale = docsgen.pages.check()
    assert stale == [], f"stale: {stale}; run `python -m docsgen` (make docs-reference)"


def test_check_names_each_stale_page_on_stderr_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(docsgen.pages, "ROOT", tmp_path)
    assert main([]) == 0  # writes every page under tmp_path
    capsys.readouterr()
    assert main(["--check"]) == 0
    assert capsys.readouterr().err == ""

    (tmp_path / "docs/reference/metrics.md").write_text("# Metrics\n", encoding="utf-8")
    (tmp_path / "docs/reference/cli-sink.md").unlink()
    assert main(["--check"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("docs/reference/cli-sink.md: ")
    assert lines[1].startswith("docs/reference/metrics.md: ")
    assert (tmp_path / "docs/reference/metrics.md").read_text(encoding="utf-8") == "# Metrics\n"


def test_the_pages_do_not_depend_on_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    before = docsgen.pages.render_all()
    monkeypatch.setenv("OUTBOX_LIMIT", "3")
    monkeypatch.setenv("OUTBOX_DB", "/somewhere/else.db")
    monkeypatch.setenv("OUTBOX_ALLOW_HOST", "a.example")
    monkeypatch.setenv("USER", "someone")
    monkeypatch.setenv("COLUMNS", "20")
    assert docsgen.pages.render_all() == before


# ---------------------------------------------------------------- command lines


def test_every_option_of_both_parsers_is_on_its_page_and_in_configuration() -> None:
    pages = docsgen.pages.render_all()
    config = pages["docs/reference/configuration.md"]
    for program, page in zip(
        cli_model.programs(),
        (pages["docs/reference/cli-publisher.md"], pages["docs/reference/cli-sink.md"]),
        strict=True,
    ):
        for command in program.commands:
            assert f"`{command.name}`" in page or command.subcommand is None
            for option in command.options:
                assert f"`{option.invocation}`" in page, (command.name, option.flag)
                if option.env:
                    assert f"`{option.env}`" in page
                    assert f"`{option.env}`" in config


def test_the_publisher_page_shows_cookie_secure_and_its_variable() -> None:
    page = docsgen.pages.render_all()["docs/reference/cli-publisher.md"]
    row = next(line for line in page.splitlines() if line.startswith("| `--cookie-secure`"))
    assert "`OUTBOX_COOKIE_SECURE`" in row
    assert "Secure" in row


def test_an_option_added_to_a_parser_shows_on_the_page() -> None:
    def with_extra_option() -> argparse.ArgumentParser:
        parser = sink_parser()
        add_option(parser, "--frobnicate-limit", type=int, default=7, help="how much to frobnicate")
        return parser

    program = cli_model.program("outbox-sink", "python -m sink", with_extra_option)
    page = cli_pages.render(program)
    row = next(line for line in page.splitlines() if line.startswith("| `--frobnicate-limit"))
    assert "`OUTBOX_FROBNICATE_LIMIT`" in row
    assert "`7`" in row
    assert "How much to frobnicate." in row
    assert "--frobnicate-limit" not in docsgen.pages.render_all()["docs/reference/cli-sink.md"]


def test_defaults_are_the_code_s_own() -> None:
    (serve,) = [c for c in cli_model.programs()[0].commands if c.subcommand == "serve"]
    options = {option.flag: option for option in serve.options}
    assert options["--port"].default == "8000"
    assert options["--db"].required
    assert options["--sink"].repeatable
    assert options["--log-format"].choices == ("text", "json")


def test_the_hand_written_notes_name_real_commands_and_options() -> None:
    names = {command.name for program in cli_model.programs() for command in program.commands}
    assert set(cli_pages.NOTES) <= names
    flags = {
        option.flag
        for program in cli_model.programs()
        for command in program.commands
        for option in command.options
    }
    assert set(cli_model.MACHINE_DEFAULTS) <= flags


# ---------------------------------------------------------------- configuration


def test_the_token_variables_are_those_the_code_names() -> None:
    assert set(configuration.token_variables()) == set(configuration.TOKEN_VARIABLES)


def test_the_uri_parameters_are_those_pg_tx_takes() -> None:
    assert set(configuration.URI_PARAMETERS) == set(pg_settings._OURS)
    uri = "postgresql://user@127.0.0.1:5432/db?deadline=2.5&pool_max=3&prepare=off&schema=s1"
    parsed = pg_settings.parse(uri)
    assert (parsed.deadline_s, parsed.pool_max, parsed.prepare, parsed.schema) == (
        2.5,
        3,
        False,
        "s1",
    )
    assert "deadline" not in parsed.conninfo  # the project's own, not libpq's
    defaults = pg_settings.parse("postgresql://user@127.0.0.1:5432/db")
    documented = {name: value[0] for name, value in configuration.URI_PARAMETERS.items()}
    assert documented["deadline"] == f"{defaults.deadline_s:g}"
    assert documented["pool_max"] == str(defaults.pool_max)
    assert documented["prepare"] == ("on" if defaults.prepare else "off")


# ---------------------------------------------------------------- metrics


def test_the_metrics_page_names_every_metric_of_both_registries() -> None:
    page = docsgen.pages.render_all()["docs/reference/metrics.md"]
    assert "`publisher_fenced_gaps_crossed_total`" in page
    assert "`publisher_ready`" in page  # registered by the app, not PublisherMetrics
    assert "`sink_ready`" in page
    for found in metrics.service_metrics().values():
        for metric in found:
            assert f"`{metric.name}`" in page


def test_a_metric_added_to_a_registry_shows_on_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import CollectorRegistry, Gauge

    original = metrics.sink_registry

    def with_extra(directory: Path) -> CollectorRegistry:
        registry = original(directory)
        Gauge("sink_frobnications", "Frobnications so far.", ["colour"], registry=registry)
        return registry

    monkeypatch.setattr(metrics, "sink_registry", with_extra)
    row = next(line for line in metrics.render().splitlines() if "sink_frobnications" in line)
    assert "gauge" in row and "`colour`" in row and "Frobnications so far." in row


# ---------------------------------------------------------------- database


def test_every_table_has_a_description_and_every_description_a_table() -> None:
    tables = database.table_names()
    assert tables == set(database.DESCRIPTIONS)


def test_the_database_page_shows_each_backend_s_columns() -> None:
    page = docsgen.pages.render_all()["docs/reference/database.md"]
    row = next(line for line in page.splitlines() if line.startswith("| `seq` |"))
    assert "`INTEGER PRIMARY KEY AUTOINCREMENT`" in row  # SQLite
    assert "`BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY`" in row  # PostgreSQL


def test_the_postgres_versions_table_is_the_one_pg_tx_creates() -> None:
    source = (ROOT / "pg_tx" / "migrations.py").read_text(encoding="utf-8")
    assert "side TEXT PRIMARY KEY, version INTEGER NOT NULL" in source


def test_a_script_splits_outside_dollar_quotes() -> None:
    script = """
    -- a comment; with a semicolon
    CREATE TABLE t (a INT);
    CREATE FUNCTION f() RETURNS integer LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'x'; END $$;
    """
    assert database.statements(script) == [
        "CREATE TABLE t (a INT)",
        "CREATE FUNCTION f() RETURNS integer LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'x';"
        " END $$",
    ]


# ---------------------------------------------------------------- HTTP


@pytest.mark.parametrize("package", ["publisher", "sink"])
def test_every_route_and_schema_of_the_document_has_a_section(package: str) -> None:
    document = load_document(package)
    page = http_pages.render(package)
    for path, item in document["paths"].items():
        for method in item:
            if method in http_pages.METHODS:
                assert f"### `{method.upper()} {path}`" in page
    for name in document["components"]["schemas"]:
        assert f"### {name}\n" in page
    assert "`GET /openapi.json`" in page


def test_a_route_added_to_the_document_shows_on_the_page() -> None:
    document = copy.deepcopy(load_document("sink"))
    document["paths"]["/frobnicate"] = {
        "post": {
            "summary": "Frobnicate the inbox",
            "responses": {"204": {"description": "Frobnicated."}},
        }
    }
    page = http_pages.render_document("sink", document)
    assert "### `POST /frobnicate`" in page
    assert "| `204` | Frobnicated. |" in page


def test_the_served_route_exists() -> None:
    from plumbing.openapi import OPENAPI_PATH, add_openapi_route

    assert OPENAPI_PATH == "/openapi.json"
    assert callable(add_openapi_route)


# ---------------------------------------------------------------- Python API


def test_the_python_api_page_covers_every_exported_name() -> None:
    page = (ROOT / "docs/reference/python-api.md").read_text(encoding="utf-8")
    mentioned = set(re.findall(r"^::: ([\w.]+)$", page, re.M))
    mentioned |= set(re.findall(r"`((?:publisher|sink|shared)\.\w+)`", page))
    mentioned |= {"publisher.dispatch"} if "::: publisher.dispatch.dispatch" in page else set()
    reexported = {"Event", "InvalidEvent", "Conflict", "MAX_BATCH"}  # from shared
    for module in (publisher, sink, shared):
        for name in module.__all__:
            if module is publisher and name in reexported:
                continue
            assert f"{module.__name__}.{name}" in mentioned or (
                name == "NotInTransaction"
                and "plumbing.in_transaction.NotInTransaction" in mentioned
            ), f"{module.__name__}.{name} is not on the Python API page"


def test_the_metric_notes_name_real_metrics() -> None:
    names = {m.name for found in metrics.service_metrics().values() for m in found}
    assert set(metrics.NOTES) <= names
