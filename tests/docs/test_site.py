"""The documentation cannot rot: the site builds with --strict, every page is in the
navigation, and the README stays one screen. (The generated reference pages are checked
by test_generated_reference.py; the Python blocks of the docs and the README run as
tests of their own in `make test`.)"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BUILD_TIMEOUT_S = 240.0
README_MAX_LINES = 250


class _ConfigLoader(yaml.SafeLoader):
    """mkdocs.yml names Python objects (`!!python/name:`); only its data is read here."""


_ConfigLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def load_config(path: Path) -> dict[str, Any]:
    config = yaml.load(path.read_text(encoding="utf-8"), Loader=_ConfigLoader)
    assert isinstance(config, dict)
    return config


def nav_pages(entries: object) -> Iterator[str]:
    """Each page path of a MkDocs `nav`, in order."""
    if isinstance(entries, str):
        yield entries
    elif isinstance(entries, list):
        for entry in entries:
            yield from nav_pages(entry)
    elif isinstance(entries, dict):
        for value in entries.values():
            yield from nav_pages(value)


def build(config_file: Path, site_dir: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict`, run where `make docs` runs it (the snippets of
    docs/changelog.md are found from there)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = ["mkdocs", "build", "--strict", "-f", str(config_file), "-d", str(site_dir)]
    return subprocess.run(
        [sys.executable, "-m", *command],
        cwd=config_file.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )


def explain(result: subprocess.CompletedProcess[str]) -> str:
    output = result.stdout + result.stderr
    warnings = [line for line in output.splitlines() if re.match(r"(WARNING|ERROR)\b", line)]
    shown = "\n".join(warnings) if warnings else output[-4000:]
    return f"mkdocs build --strict exited {result.returncode}:\n{shown}"


@pytest.mark.timeout(BUILD_TIMEOUT_S + 30)
def test_the_site_builds_with_strict(tmp_path: Path) -> None:
    result = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, explain(result)
    assert (tmp_path / "site" / "index.html").is_file()


def test_every_page_is_in_the_navigation_and_every_entry_exists() -> None:
    listed = list(nav_pages(load_config(ROOT / "mkdocs.yml")["nav"]))
    on_disk = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    duplicated = sorted({page for page in listed if listed.count(page) > 1})
    assert not duplicated, f"listed twice in mkdocs.yml's nav: {duplicated}"
    missing = sorted(set(listed) - on_disk)
    assert not missing, f"in mkdocs.yml's nav, but not in docs/: {missing}"
    unlisted = sorted(on_disk - set(listed))
    assert not unlisted, f"in docs/, but not in mkdocs.yml's nav: {unlisted}"


def test_the_readme_is_one_screen() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move the detail "
        "to a page of docs/ and link to it"
    )


# The build above passes only if --strict really fails on a broken page: the same
# mkdocs.yml, on a site whose pages are stubs, one of them with the fault named.
FAULTS = {
    "none": "",
    "a link to a missing page": "[gone](no-such-page.md)",
    "a link to a missing anchor": "[gone](glossary.md#no-such-heading)",
    "a link outside the docs": "[gone](../README.md)",
}


@pytest.fixture(scope="module")
def stub_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of mkdocs.yml with a one-line stub for each page of its navigation."""
    site = tmp_path_factory.mktemp("stub-site")
    shutil.copy(ROOT / "mkdocs.yml", site / "mkdocs.yml")
    (site / "CHANGELOG.md").write_text("# Changelog\n\n## 0.1.0\n", encoding="utf-8")
    for page in nav_pages(load_config(ROOT / "mkdocs.yml")["nav"]):
        path = site / "docs" / page
        path.parent.mkdir(parents=True, exist_ok=True)
        if page == "changelog.md":
            shutil.copy(DOCS / "changelog.md", path)  # the include, as it is
        else:
            path.write_text(f"# {page}\n\nA stub.\n", encoding="utf-8")
    return site


@pytest.mark.parametrize("fault", FAULTS, ids=list(FAULTS))
@pytest.mark.timeout(BUILD_TIMEOUT_S + 30)
def test_strict_fails_on_a_broken_link(stub_site: Path, fault: str, tmp_path: Path) -> None:
    page = stub_site / "docs" / "index.md"
    text = f"# Home\n\nSee {FAULTS[fault]}.\n" if FAULTS[fault] else "# Home\n"
    page.write_text(text, encoding="utf-8")
    result = build(stub_site / "mkdocs.yml", tmp_path / "site")
    if fault == "none":
        assert result.returncode == 0, explain(result)
    else:
        assert result.returncode != 0, f"built in spite of {fault}"
        output = result.stdout + result.stderr
        assert re.search(r"^WARNING .*'index\.md'", output, re.MULTILINE), explain(result)


def test_the_upgrade_page_shows_the_schema_version_this_program_writes() -> None:
    """Its example output names the SQLite publisher schema's newest version twice, and
    --version's line is what the program prints."""
    from publisher.backends.sqlite_sql import SCHEMA
    from publisher.cli import main

    page = (ROOT / "docs/how-to/upgrade.md").read_text(encoding="utf-8")
    shown = re.findall(r"publisher\|(\d+)$|this program knows \((\d+)\)", page, re.M)
    assert len(shown) == 2, shown
    assert {int(a or b) for a, b in shown} == {SCHEMA.version}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit):
        main(["--version"])
    assert f"$ outbox-publisher --version\n{printed.getvalue()}```" in page
