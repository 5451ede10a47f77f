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

The layers: every module of the runtime belongs to one of :data:`RUNTIME_LAYERS` and imports
only from its own layer or lower ones, whether at module level, for types only or inside a
function (one documented exception: :data:`TYPE_ONLY_UPWARD`); ``trainer_runtime.errors`` is a
leaf and storage owns its own errors. The operator's parts follow :data:`OPERATOR_LAYERS`,
and the reconcile package's modules :data:`RECONCILE_LAYERS`. Inside functions only optional
heavy dependencies are imported (:data:`LAZY_ALLOWED`), in both packages.
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


@pytest.mark.slow  # an interpreter per module
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


# --------------------------------------------------------------------------- layers

#: The runtime's layers, lowest first: a module imports only from its own layer or lower ones
#: (at module level, under ``TYPE_CHECKING`` and inside functions alike). Entries are module
#: names under ``trainer_runtime`` (a package stands for every module in it).
RUNTIME_LAYERS: tuple[tuple[str, ...], ...] = (
    # leaves: the standard library (and the operator's dependency-free leaves) only
    ("errors", "_layout", "tpu", "preemption", "_driver_metrics"),
    # storage owns its errors (StorageError) and knows only the leaves
    ("storage",),
    (
        "checkpoint",
        "reported_checkpoint",
        "_snapshot",
        "_metrics",
        "_raylet",
        "_fencing",
        "_shared_download",
    ),
    ("config", "callbacks", "context", "data_config"),
    (
        "checkpoint_manager",
        "result",
        "_events",
        "_uploader",
        "_validation",
        "_tpu_slices",
        "_failure_policy",
        "_scaling_policy",
    ),
    # the coordinator and its parts (one per job), and the worker's session
    (
        "_session",
        "_coordinator",
        "_preemption_state",
        "_validation_routing",
        "_rounds",
        "_requests",
    ),
    ("_worker", "collective", "worker_group"),
    ("backend",),
    ("_controller", "_local"),
    ("trainer",),
    ("torch", "jax"),
    ("",),  # the package itself: its public API
)
#: The operator package's parts, lowest first (the launcher sits beside the renderers: it uses
#: the API, the constants and the REST client, see LAUNCHER_MAY_IMPORT).
OPERATOR_LAYERS: tuple[tuple[str, ...], ...] = (
    ("constants", "tpu_topology", "memory_trim"),
    ("api",),
    ("kube",),
    ("render", "launcher"),
    ("reconcile",),
    ("pod_watch", "leader", "admission"),
    ("sdk",),
    ("operator_main",),
    ("cli", "manifest_cli", "cluster_cli", "__main__"),
    ("",),
)
#: The reconcile package's modules, lowest first (the order its docstring gives).
RECONCILE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("transitions",),
    ("plan",),
    ("pods",),
    ("failure_rules",),
    ("validation_pool",),
    ("state_machine",),
    ("fingerprint",),
    ("apply",),
    ("",),
)
#: Type-only imports allowed to point up, with why: the hooks of ``callbacks`` are typed
#: against the objects the controller hands them (a checkpoint's record, the run's result),
#: while ``RunConfig`` (below those) checks that its callbacks are hooks.
TYPE_ONLY_UPWARD = {
    "trainer_runtime.callbacks": {
        "trainer_runtime.checkpoint_manager",
        "trainer_runtime.result",
    },
}
#: What may be imported inside a function: optional or heavy dependencies that a module must
#: not load before it needs them (Ray, the ML frameworks, the cloud storage clients, kopf's
#: webhook server in ``trainjob validate``), and the subpackages that import them.
LAZY_ALLOWED = (
    "ray",
    "torch",
    "jax",
    "jaxlib",
    "numpy",
    "pyarrow",
    "pandas",  # Result.metrics_dataframe only
    "google",
    "google_crc32c",  # google-cloud-storage's checksum library (the GCS download's check)
    "requests",
    "kopf",
    "pathspec",
    "trainer_runtime.torch",
    "trainer_runtime.jax",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, str, int]]:
    """(module, where, line) of every import statement in ``path``; ``where`` is ``module``,
    ``type`` (under ``if TYPE_CHECKING``) or ``local`` (inside a function). ``from pkg import
    name`` counts as ``pkg.name`` when that is a module of the project."""
    found: list[tuple[str, str, int]] = []

    def names(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        if node.level or not node.module:
            return []
        out = []
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            as_path = REPO / Path(*sub.split("."))
            is_module = as_path.with_suffix(".py").is_file() or (as_path / "__init__.py").is_file()
            out.append(sub if is_module else node.module)
        return out

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = "local"
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inner = "type" if where == "module" else where
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.extend((name, where, child.lineno) for name in names(child))
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), "module")
    return found


def _layer(module: str, package: str, layers: tuple[tuple[str, ...], ...]) -> int | None:
    rest = module[len(package) :].lstrip(".")
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, layer in enumerate(layers):
        for entry in layer:
            matches = rest == entry or (entry and rest.startswith(entry + "."))
            if matches and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    return best[1] if best is not None else None


def _layer_violations(package: str, layers: tuple[tuple[str, ...], ...]) -> list[str]:
    root = REPO / Path(*package.split("."))
    bad = []
    for path in sorted(root.rglob("*.py")):
        source = _module_name(path)
        mine = _layer(source, package, layers)
        if mine is None:
            bad.append(f"{source}: in no layer")
            continue
        for target, where, line in _imports(path):
            if target != package and not target.startswith(package + "."):
                continue
            theirs = _layer(target, package, layers)
            if theirs is None or theirs <= mine:
                continue
            if where == "type" and target in TYPE_ONLY_UPWARD.get(source, ()):
                continue
            bad.append(f"{path.relative_to(REPO)}:{line}: {source} ({where}) imports {target}")
    return bad


def test_the_runtime_layers_point_down() -> None:
    assert not _layer_violations("trainer_runtime", RUNTIME_LAYERS)


def test_the_operator_layers_point_down() -> None:
    assert not _layer_violations("trainjob_operator", OPERATOR_LAYERS)


def test_the_reconcile_modules_point_down() -> None:
    assert not _layer_violations("trainjob_operator.reconcile", RECONCILE_LAYERS)


def test_the_layer_check_sees_an_upward_import() -> None:
    assert _layer("trainer_runtime.storage.base", "trainer_runtime", RUNTIME_LAYERS) == 1
    assert _layer("trainer_runtime", "trainer_runtime", RUNTIME_LAYERS) == len(RUNTIME_LAYERS) - 1
    probe = REPO / "trainer_runtime" / "storage" / "base.py"
    kinds = {(name, where) for name, where, _ in _imports(probe)}
    assert ("trainer_runtime.errors", "module") in kinds
    # The allowed exceptions are real upward, type-only imports (not stale entries).
    for source, targets in TYPE_ONLY_UPWARD.items():
        path = (REPO / Path(*source.split("."))).with_suffix(".py")
        typed = {name for name, where, _ in _imports(path) if where == "type"}
        for target in targets:
            assert target in typed, (source, target)
            up = _layer(target, "trainer_runtime", RUNTIME_LAYERS)
            assert up is not None and up > (_layer(source, "trainer_runtime", RUNTIME_LAYERS) or 0)


def test_errors_is_a_leaf() -> None:
    """``trainer_runtime.errors`` imports nothing of the package, not even for types."""
    path = REPO / "trainer_runtime" / "errors.py"
    project = [name for name, _, _ in _imports(path) if name.split(".")[0] in PACKAGES]
    assert project == []


def test_no_function_local_imports_but_optional_heavy_dependencies() -> None:
    """Imports live at the top of a module, where the layers can be read; inside a function
    only what :data:`LAZY_ALLOWED` names (a dependency a module must not load early)."""
    bad = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for name, where, line in _imports(path):
                lazy_ok = any(name == ok or name.startswith(ok + ".") for ok in LAZY_ALLOWED)
                if where == "local" and not lazy_ok:
                    bad.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert not bad, bad
