"""Which pages are generated, and writing or checking them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent


def _cli(index: int) -> Callable[[], str]:
    def render() -> str:
        from docsgen import cli_model, cli_pages

        return cli_pages.render(cli_model.programs()[index])

    return render


def _http(package: str) -> Callable[[], str]:
    def render() -> str:
        from docsgen import http_pages

        return http_pages.render(package)

    return render


def _configuration() -> str:
    from docsgen import configuration

    return configuration.render()


def _metrics() -> str:
    from docsgen import metrics

    return metrics.render()


def _database() -> str:
    from docsgen import database

    return database.render()


# Each generated page (relative to the repository root) and what writes it.
PAGES: Final[dict[str, Callable[[], str]]] = {
    "docs/reference/cli-publisher.md": _cli(0),
    "docs/reference/cli-sink.md": _cli(1),
    "docs/reference/http-publisher.md": _http("publisher"),
    "docs/reference/http-sink.md": _http("sink"),
    "docs/reference/configuration.md": _configuration,
    "docs/reference/metrics.md": _metrics,
    "docs/reference/database.md": _database,
}


def render_all() -> dict[str, str]:
    """Every page's text as the code produces it now, by path."""
    return {path: render() for path, render in PAGES.items()}


def write(root: Path | None = None) -> list[str]:
    """Write every page that differs under `root` (the repository's by default); the
    paths written."""
    root = ROOT if root is None else root
    written = []
    for path, content in render_all().items():
        target = root / path
        if not target.exists() or target.read_text(encoding="utf-8") != content:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
            written.append(path)
    return written


def check(root: Path | None = None) -> list[str]:
    """The pages under `root` (the repository's by default) that are missing or differ
    from what the code produces; writes nothing."""
    root = ROOT if root is None else root
    stale = []
    for path, content in render_all().items():
        target = root / path
        if not target.exists() or target.read_text(encoding="utf-8") != content:
            stale.append(path)
    return stale
