"""The import graph: every module imports on its own, and the operator stays off the runtime.

Modelled on Ray's ``python/ray/tests/test_circular_imports.py``: each public module is imported
first in a fresh interpreter, so an import cycle that a warm ``sys.modules`` would hide (module A
half-initialised when B asks it for a name) fails here with an ``ImportError``.

The operator's control plane (renderers, reconciler, operator entry point) runs in an image
without Ray, torch or jax; it shares only the TPU table with the runtime, through the
dependency-free leaf ``trainjob_operator.tpu_topology``, and the names of the pods' contract
(environment variables) through ``trainjob_operator.constants``, a leaf too. The runtime, in
turn, loads nothing of the operator but those leaves.

The launcher (``trainjob_operator.launcher``: the in-pod driver and ``trainjob run``) is the one
part of the package that uses the runtime, on purpose; it depends on the API, the constants and
the REST client only, never on the control plane (renderers, planner, reconciler, operator), so
the driver and the operator meet only in the TrainJob and its status. It is checked twice: the
modules each launcher module loads, and every import statement in its source (a lazy import
inside a function included).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("trainjob_operator", "trainer_runtime")
LEAF = "trainjob_operator.tpu_topology"
CONTROL_PLANE = (
    "trainjob_operator.render",
    "trainjob_operator.reconcile",
    "trainjob_operator.operator_main",
    "trainjob_operator.pod_watch",
)
HEAVY = ("ray", "torch", "jax")
LAUNCHER = "trainjob_operator.launcher"
# What the launcher may import of the operator package: the API, the vocabulary, the REST
# client, the TPU leaf and itself.
LAUNCHER_MAY_IMPORT = (
    "trainjob_operator.api",
    "trainjob_operator.constants",
    "trainjob_operator.kube",
    LEAF,
    LAUNCHER,
)

# Modules that need an optional extra to import at all (the extra, not the code, is missing).
OPTIONAL = {"trainer_runtime.jax": "jax", "trainer_runtime.torch": "torch"}


def public_modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        for info in pkgutil.walk_packages([str(REPO / package)], prefix=f"{package}."):
            if not any(part.startswith("_") for part in info.name.split(".")[1:]):
                names.append(info.name)
    return sorted(names)


@functools.cache
def fresh_import(module: str) -> tuple[int, str]:
    """Import ``module`` alone in a new interpreter; its rc and its output (or its modules).

    Cached: every test asking about the same module reads the same run."""
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    return proc.returncode, proc.stdout if proc.returncode == 0 else proc.stderr


def test_the_walk_finds_the_packages() -> None:
    modules = public_modules()
    assert LEAF in modules
    assert {*CONTROL_PLANE, "trainer_runtime.tpu", "trainjob_operator.api.tpu"} <= set(modules)
    assert {f"{LAUNCHER}.driver", f"{LAUNCHER}.local", f"{LAUNCHER}.trainer"} <= set(modules)


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    modules = public_modules()
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = dict(zip(modules, pool.map(fresh_import, modules), strict=True))
    failures = {}
    for module, (rc, output) in results.items():
        if rc == 0:
            continue
        missing = next(
            (extra for name, extra in OPTIONAL.items() if module.split(".")[:2] == name.split(".")),
            None,
        )
        if missing and f"No module named '{missing}'" in output:
            continue
        failures[module] = output.strip().splitlines()[-1] if output.strip() else f"rc={rc}"
    assert not failures, failures


def loaded(module: str) -> set[str]:
    rc, output = fresh_import(module)
    assert rc == 0, output
    return set(json.loads(output))


@pytest.mark.parametrize("module", CONTROL_PLANE)
def test_the_control_plane_loads_no_runtime_and_no_ml_framework(module: str) -> None:
    modules = loaded(module)
    runtime = sorted(m for m in modules if m.split(".")[0] == "trainer_runtime")
    assert not runtime, f"{module} loads the runtime: {runtime}"
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"{module} loads {heavy}"


@pytest.mark.parametrize("leaf", [LEAF, "trainjob_operator.constants"])
def test_the_leaves_import_only_the_standard_library(leaf: str) -> None:
    modules = loaded(leaf)
    project = sorted(m for m in modules if m.split(".")[0] in PACKAGES)
    assert project == ["trainjob_operator", leaf]
    outside = sorted(
        m
        for m in modules
        if m.split(".")[0] not in sys.stdlib_module_names
        and m.split(".")[0] not in PACKAGES
        and not m.startswith("_")
        and m not in {"__main__", "sitecustomize", "usercustomize"}
    )
    assert not outside, outside


def test_the_runtime_loads_only_the_leaves_of_the_operator() -> None:
    leaves = {"trainjob_operator", LEAF, "trainjob_operator.constants"}
    for module in ("trainer_runtime", "trainer_runtime.tpu", "trainer_runtime.preemption"):
        operator = {m for m in loaded(module) if m.split(".")[0] == "trainjob_operator"}
        assert operator <= leaves, f"{module} loads {sorted(operator - leaves)}"


def test_the_operator_api_uses_the_leafs_table() -> None:
    import trainer_runtime.tpu as runtime_tpu
    import trainjob_operator.api.tpu as api_tpu
    import trainjob_operator.tpu_topology as leaf

    for name in leaf.__all__:
        assert getattr(api_tpu, name) is getattr(leaf, name) is getattr(runtime_tpu, name)


def _outside_launcher_contract(module: str) -> bool:
    if module.split(".")[0] != "trainjob_operator" or module == "trainjob_operator":
        return False
    return not any(module == ok or module.startswith(ok + ".") for ok in LAUNCHER_MAY_IMPORT)


def launcher_modules() -> list[str]:
    return [m for m in public_modules() if m == LAUNCHER or m.startswith(LAUNCHER + ".")]


def imported_names(path: Path) -> set[str]:
    """Every module an ``import``/``from ... import`` statement in ``path`` names (lazy ones
    inside functions included); ``from pkg import mod`` counts as ``pkg.mod`` too."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_launcher_contract_rejects_the_control_plane() -> None:
    for module in (*CONTROL_PLANE, "trainjob_operator.render.workers", "trainjob_operator.cli"):
        assert _outside_launcher_contract(module), module
    for module in ("trainjob_operator.api.trainjob", "trainjob_operator.kube", LEAF, "ray"):
        assert not _outside_launcher_contract(module), module


def test_the_launcher_source_imports_no_control_plane() -> None:
    files = sorted((REPO / "trainjob_operator" / "launcher").rglob("*.py"))
    assert files
    bad = {
        str(path.relative_to(REPO)): sorted(
            filter(_outside_launcher_contract, imported_names(path))
        )
        for path in files
    }
    bad = {path: names for path, names in bad.items() if names}
    assert not bad, f"the launcher imports the operator's control plane: {bad}"


@pytest.mark.parametrize("module", launcher_modules())
def test_the_launcher_loads_no_control_plane(module: str) -> None:
    rc, output = fresh_import(module)
    if rc != 0 and "No module named 'ray'" in output:
        pytest.skip("the runtime extra (ray) is not installed")
    assert rc == 0, output
    operator = sorted(filter(_outside_launcher_contract, json.loads(output)))
    assert not operator, f"{module} loads {operator}"
