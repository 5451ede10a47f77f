"""The import graph: every module imports on its own, and the operator stays off the runtime.

Modelled on Ray's ``python/ray/tests/test_circular_imports.py``: each public module is imported
first in a fresh interpreter, so an import cycle that a warm ``sys.modules`` would hide (module A
half-initialised when B asks it for a name) fails here with an ``ImportError``.

The operator's control plane (renderers, reconciler, operator entry point) runs in an image
without Ray, torch or jax; it shares only the TPU table with the runtime, through the
dependency-free leaf ``trainjob_operator.tpu_topology``. The runtime, in turn, loads nothing of
the operator but that leaf. (The in-pod driver, ``trainjob_operator.driver`` and its helpers, is
the one part of the operator that uses the runtime, and it does so on purpose.)
"""

from __future__ import annotations

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
)
HEAVY = ("ray", "torch", "jax")

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


def fresh_import(module: str) -> tuple[int, str]:
    """Import ``module`` alone in a new interpreter; its rc and its output (or its modules)."""
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


def test_the_runtime_loads_only_the_tpu_leaf_of_the_operator() -> None:
    for module in ("trainer_runtime", "trainer_runtime.tpu"):
        operator = sorted(m for m in loaded(module) if m.split(".")[0] == "trainjob_operator")
        assert operator in ([], ["trainjob_operator", LEAF]), f"{module} loads {operator}"


def test_the_operator_api_uses_the_leafs_table() -> None:
    import trainer_runtime.tpu as runtime_tpu
    import trainjob_operator.api.tpu as api_tpu
    import trainjob_operator.tpu_topology as leaf

    for name in leaf.__all__:
        assert getattr(api_tpu, name) is getattr(leaf, name) is getattr(runtime_tpu, name)
