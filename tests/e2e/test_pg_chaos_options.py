"""`python -m chaos` and `python -m bench` with PostgreSQL options they must refuse, each
with one line and exit status 2, before anything is started; and a run in the schemas
of an operator's database leaves no schema behind."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support import run_module

if TYPE_CHECKING:
    from conftest import PgSchemas, Query

pytestmark = pytest.mark.e2e

SECRET = "s3cr3t-pw"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--backend", "postgres", "--db-url", f"postgresql://outbox:{SECRET}@127.0.0.1/x"],
            "PGPASSWORD",
        ),
        (
            ["--backend", "postgres", "--db-url", f"postgresql://outbox@127.0.0.1/x?password={SECRET}"],
            "PGPASSWORD",
        ),
        (
            ["--backend", "postgres", "--db-url", "postgresql://outbox@127.0.0.1/x?options=-cx%3D1"],
            "sets options",
        ),
        (["--db-url", "postgresql://outbox@127.0.0.1/x"], "--db-url is for --backend postgres"),
        (["--backend", "postgres", "--db-url", "mysql://h/x"], "postgresql://"),
        (
            ["--backend", "postgres", "--db-url", "postgresql://outbox@127.0.0.1/x",
             "--pg-restarts", "1"],
            "--pg-restarts needs",
        ),
        (["--pg-restarts", "1"], "--pg-restarts needs"),
        (["--workers", "2"], "--workers and --sinks above 1 need --backend postgres"),
        (["--sinks", "2"], "--workers and --sinks above 1 need --backend postgres"),
        (["--workers", "0"], "--workers"),
        (["--workers", "17"], "--workers"),
        (["--pauses", "-1"], "--pauses"),
        (["--backend", "postgres", "--workers", "2", "--lease-ttl", "61"], "--lease-ttl"),
        (["--lease-ttl", "0"], "--lease-ttl"),
    ],
)  # fmt: skip
def test_chaos_refuses_a_bad_postgres_option_in_one_line(
    tmp_path: Path, child_env: dict[str, str], args: list[str], said: str
) -> None:
    workdir = tmp_path / "w"

    done = run_module(
        "chaos", "run", "--events", "3", *args, "--workdir", str(workdir),
        env=child_env, cwd=tmp_path, timeout=30,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], done.stderr
    assert SECRET not in done.stderr + done.stdout
    assert not list(workdir.glob("*.log")), "nothing may have been started"


def test_bench_refuses_a_password_in_the_url(tmp_path: Path, child_env: dict[str, str]) -> None:
    url = f"postgresql://outbox:{SECRET}@127.0.0.1/x"
    args = ["--backend", "postgres", "--db-url", url, "--out", str(tmp_path / "r.json")]

    root = Path(__file__).resolve().parents[2]  # bench is run from the repository
    done = run_module("bench", *args, env=child_env, cwd=root, timeout=30)

    assert done.returncode == 2, done.stderr
    assert "PGPASSWORD" in done.stderr and SECRET not in done.stderr, done.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.timeout(120)
def test_a_run_in_an_operators_database_drops_its_schemas(
    tmp_path: Path, child_env: dict[str, str], pg_schemas: PgSchemas, db_rows: Query
) -> None:
    args = ["--events", "20", "--kills", "2", "--seed", "2", "--json"]
    database = pg_schemas.database_url  # the operator's: no search_path of the test's

    done = run_module(
        "chaos", "run", *args, "--backend", "postgres", "--db-url", database,
        env=child_env, cwd=tmp_path, timeout=100,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    schemas = "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'chaos%'"
    assert db_rows(database, schemas) == []  # made for the run, dropped at its end
    assert db_rows(database, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]


def test_make_demo_postgres_runs_the_two_spec_scenarios_and_a_chaos_run_on_postgres() -> None:
    """The Makefile target's commands, parsed by the chaos CLI itself (running it is
    what `make demo-postgres` is for; each part is run by the tests above and in
    test_chaos.py and test_pg_server_outage.py)."""
    import shlex

    from chaos.cli import build_parser

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    phony = {name for line in makefile.splitlines() if line.startswith(".PHONY:")
             for name in line.split(":", 1)[1].split()}  # fmt: skip
    assert "demo-postgres" in phony
    lines = makefile.split("\ndemo-postgres:", 1)[1].split("\n\n", 1)[0].splitlines()
    assert lines[0].split() == ["runtime", "postgres-binaries"], lines[0]
    recipes = [shlex.split(line.strip()) for line in lines[1:] if line.startswith("\t")]
    parsed = []
    for argv in recipes:
        assert argv[:3] == ["$(BIN)/python", "-m", "chaos"], argv
        parsed.append(build_parser().parse_args(argv[3:]))
    assert [(p.command, p.backend, p.db_url) for p in parsed] == [
        ("scenario", "postgres", None),
        ("run", "postgres", None),
    ]
    assert parsed[0].names == ["crash-after-ack", "drop-after-commit"]
    assert parsed[1].kills > 0 and parsed[1].pg_restarts > 0
