"""Only product code in the product, and its dependencies where they are used.

The installed package (and so the operator and runtime images) holds ``trainjob_operator`` and
``trainer_runtime`` only. Test support lives in ``tests/support/``; the product never imports
tests, pytest or the Kubernetes Python client (a test-only dependency). The core dependencies
in pyproject.toml are exactly what the operator's modules import when they load; what they
import lazily, inside functions (Ray for ``trainjob run`` and the in-pod driver), comes from an
extra.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("trainjob_operator", "trainer_runtime")
TEST_ONLY = {"tests", "pytest", "kubernetes"}

# Import name -> distribution name, where they differ (others: "_" becomes "-").
DISTRIBUTIONS = {
    "yaml": "pyyaml",
    "pydantic_core": "pydantic",  # pydantic's own core, installed and pinned by pydantic
}


def sources(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def imports(tree: ast.AST, *, module_level_only: bool = False) -> Iterator[str]:
    """Top-level names of the absolute imports under ``tree``; with ``module_level_only``, not
    those inside functions or ``if TYPE_CHECKING:`` (they do not run when the module loads)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]
        elif module_level_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        elif (
            module_level_only
            and isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test)
        ):
            yield from imports(
                ast.Module(body=node.orelse, type_ignores=[]), module_level_only=True
            )
        else:
            yield from imports(node, module_level_only=module_level_only)


def third_party(names: Iterable[str]) -> set[str]:
    return {
        name
        for name in names
        if name not in sys.stdlib_module_names and name not in {*PRODUCT, "__future__"}
    }


def distribution(import_name: str) -> str:
    return DISTRIBUTIONS.get(import_name, import_name.replace("_", "-")).lower()


def requirement_names(requirements: list[str]) -> set[str]:
    names = set()
    for requirement in requirements:
        match = re.match(r"[A-Za-z0-9._-]+", requirement)
        assert match, requirement
        names.add(re.sub(r"[-_.]+", "-", match.group()).lower())
    return names


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_no_test_support_in_the_product() -> None:
    assert not (REPO / "trainjob_operator" / "testing").exists(), "test support goes in tests/"
    assert (REPO / "tests" / "support" / "envtest.py").is_file()
    for package in PRODUCT:
        for path in sources(package):
            used = set(imports(ast.parse(path.read_text(), str(path)))) & TEST_ONLY
            assert not used, f"{path.relative_to(REPO)} imports {sorted(used)}"


def test_core_dependencies_are_what_the_operator_imports() -> None:
    loaded: dict[str, set[str]] = {}  # distribution -> the modules that import it on load
    for path in sources("trainjob_operator"):
        tree = ast.parse(path.read_text(), str(path))
        for name in third_party(imports(tree, module_level_only=True)):
            loaded.setdefault(distribution(name), set()).add(str(path.relative_to(REPO)))
    core = requirement_names(project()["dependencies"])
    assert set(loaded) <= core, {d: sorted(p) for d, p in loaded.items() if d not in core}
    assert core <= set(loaded), (
        f"core dependencies the operator never imports: {core - loaded.keys()}"
    )


def test_the_operators_lazy_imports_come_from_extras() -> None:
    declared = requirement_names(project()["dependencies"])
    for requirements in project()["optional-dependencies"].values():
        declared |= requirement_names(requirements)
    for path in sources("trainjob_operator"):
        names = third_party(imports(ast.parse(path.read_text(), str(path))))
        undeclared = {distribution(name) for name in names} - declared
        assert not undeclared, f"{path.relative_to(REPO)} imports {sorted(undeclared)}"
