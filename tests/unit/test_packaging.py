"""Every package of the project is installed: a sub-package missing from the list in
pyproject.toml works from a checkout (and an editable install) but is absent from
a built wheel, and so from the container image."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def listed() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return set(config["tool"]["setuptools"]["packages"])


def test_every_package_under_an_installed_one_is_installed_too() -> None:
    packages = listed()
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in {name.split(".")[0] for name in packages}
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found - packages == set()
    assert packages - found == set()  # nothing listed that does not exist


def test_the_storage_backends_are_among_them() -> None:
    assert {"publisher.backends", "sink.backends"} <= listed()
