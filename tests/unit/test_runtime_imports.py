"""`make demo` installs the package with its runtime dependencies only, and the
Dockerfile installs the same: every module the installed packages import must come
from those (or from the standard library, or the project itself). An import inside a
function, taken only when a caller passes such an object, may also come from an extra
other than `test` (SQLAlchemy's)."""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PACKAGES = [name for name in PROJECT["tool"]["setuptools"]["packages"] if "." not in name]
TEST_EXTRA = "test"


def closure(requirements: list[str], extras: frozenset[str] = frozenset()) -> set[str]:
    """The distributions `requirements` bring, theirs included, in this environment
    (a requirement behind an extra counts only for the extras named)."""
    found: set[str] = set()
    pending = [(text, extras) for text in requirements]
    for _ in range(10_000):
        if not pending:
            return found
        text, wanted = pending.pop()
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is not None and not any(
            marker.evaluate({"extra": extra}) for extra in {"", *wanted}
        ):
            continue
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        found.add(name)
        chosen = frozenset(requirement.extras)
        pending += [(each, chosen) for each in metadata.requires(requirement.name) or []]
    raise AssertionError("the dependency walk did not end")


def imports(tree: ast.AST, in_function: bool = False) -> Iterator[tuple[str, bool]]:
    """(top-level module, whether the import is inside a function) for each absolute import."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name.split(".")[0], in_function) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0], in_function
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue  # for the type checker only
        else:
            inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            yield from imports(node, inner)


def test_the_installed_packages_import_only_what_pip_install_dot_brings() -> None:
    project = PROJECT["project"]
    runtime = closure(project["dependencies"])
    extras = {
        name: closure(requirements)
        for name, requirements in project["optional-dependencies"].items()
        if name != TEST_EXTRA
    }
    lazy = runtime.union(*extras.values())
    providers = metadata.packages_distributions()
    wrong = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for module, in_function in imports(tree):
                if module in sys.stdlib_module_names or module in PACKAGES:
                    continue
                dists = {canonicalize_name(name) for name in providers.get(module, [])}
                if not dists & (lazy if in_function else runtime):
                    wrong.append(f"{path.relative_to(ROOT)}: {module} ({sorted(dists)})")
    assert not wrong, "imported, but not a runtime dependency in pyproject.toml: " + str(wrong)
