"""Malformed and hostile manifests never crash or hang ``trainjob validate`` / ``trainjob run``.

Each case is a manifest (text or bytes) and what both commands must do with it, run as a user
runs them: a subprocess, with a timeout that catches a hang (an alias bomb, runaway recursion).
Invalid input exits 2 with ``FILE: field.path: message (hint: ...)``; a runtime failure exits 1
with a clear line; nothing prints a Python traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

HEAD = """\
apiVersion: trainjob.dev/v1alpha1
kind: TrainJob
metadata:
  name: bad
spec:
  entrypoint: examples.quickstart.train:train_func
"""

#: Generous: a hang guard, not a speed check (a case that hangs would never end).
HANG_GUARD_S = 300


def _bomb() -> str:
    lines = ["  config:", '    a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 10):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"    a{i}: &a{i} [{refs}]")
    return HEAD + "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Case:
    """A manifest and the expected outcome of ``validate`` and ``run``."""

    id: str
    manifest: str | bytes
    validate: str | None
    """A substring of validate's output (exit 2), or None when the manifest is valid."""
    run: str
    """A substring of run's stderr."""
    run_exit: int = 2
    validate_may_accept: bool = False
    """The schema may or may not refuse it (e.g. a maximum the CRD may set); either way the
    outcome is clean, and ``validate`` names the field when it refuses."""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


CASES = [
    Case(
        "numWorkers-string",
        HEAD + '  scaling:\n    numWorkers: "2"\n',
        'spec.scaling.numWorkers: expected an integer, got a string ("2") '
        "(hint: write the number without quotes: 2)",
        "spec.scaling.numWorkers: expected an integer",
    ),
    Case(
        "numWorkers-bool",
        HEAD + "  scaling:\n    numWorkers: true\n",
        "spec.scaling.numWorkers: expected an integer, got a boolean (true)",
        "spec.scaling.numWorkers: expected an integer",
    ),
    Case(
        "numWorkers-float",
        HEAD + "  scaling:\n    numWorkers: 2.0\n",
        "spec.scaling.numWorkers: expected an integer, got a number (2.0) "
        "(hint: write a whole number without a decimal point: 2)",
        "spec.scaling.numWorkers: expected an integer",
    ),
    Case(
        "numWorkers-negative",
        HEAD + "  scaling:\n    numWorkers: -1\n",
        "spec.scaling.numWorkers: Input should be greater than or equal to 0",
        "spec.scaling.numWorkers",
    ),
    Case(
        "suspend-string",
        HEAD + '  suspend: "true"\n',
        'spec.suspend: expected a boolean, got a string ("true") (hint: use true or false)',
        "spec.suspend",
    ),
    Case(
        "cpu-zero",
        HEAD + '  scaling:\n    resourcesPerWorker: {cpu: "0"}\n',
        'spec.scaling.resourcesPerWorker["cpu"]: cpu must be at least 1m (0.001 CPU)',
        'spec.scaling.resourcesPerWorker["cpu"]: cpu must be at least 1m',
    ),
    Case(
        "numWorkers-million",
        HEAD + "  scaling:\n    numWorkers: 1000000\n",
        "spec.scaling.numWorkers: ",  # the CRD's maximum, if it has one
        "spec.scaling.numWorkers",
        validate_may_accept=True,
    ),
    Case(
        "numWorkers-more-than-this-machine",
        HEAD + "  scaling:\n    numWorkers: 500\n",
        None,
        "spec.scaling.numWorkers: 500 Ray workers do not fit on this machine",
    ),
    Case(
        "alias-bomb",
        _bomb(),
        "YAML anchors are not allowed (found &a0) (hint: write the values out in full",
        "YAML anchors are not allowed",
    ),
    Case(
        "alias",
        HEAD + "  config: {a: *x}\n",
        "YAML aliases are not allowed (found *x)",
        "YAML aliases are not allowed",
    ),
    Case(
        "deep-flow-nesting",
        HEAD + "  config: {a: " + "[" * 5000 + "]" * 5000 + "}\n",
        "nesting deeper than 100 levels is not allowed (hint: flatten the data",
        "nesting deeper than 100 levels",
    ),
    Case(
        "deep-block-nesting",
        HEAD
        + "  config:\n"
        + "".join(f"{'  ' * (i + 2)}k{i}:\n" for i in range(300))
        + f"{'  ' * 302}leaf: 1\n",
        "nesting deeper than 100 levels is not allowed",
        "nesting deeper than 100 levels",
    ),
    Case(
        "invalid-utf8",
        HEAD.encode() + b"  config: {a: '\xff\xfe'}\n",
        "the manifest is not UTF-8 text: byte 0xff at offset",
        "the manifest is not UTF-8 text",
    ),
    Case(
        "binary",
        bytes(range(256)) * 4,
        "the manifest is not UTF-8 text: byte 0x80 at offset 128",
        "the manifest is not UTF-8 text",
    ),
    Case(
        "nul-byte",
        HEAD.encode() + b"  config: {a: 1}\x00\n",
        "the manifest is binary: a NUL byte at offset",
        "the manifest is binary",
    ),
    Case(
        "50-MB",
        HEAD + "  config:\n    blob: '" + "x" * (50 * 2**20) + "'\n",
        "the manifest is larger than 1572864 bytes",
        "the manifest is larger than 1572864 bytes",
    ),
    Case(
        "nan",
        HEAD + "  config: {lr: .nan}\n",
        "not representable as JSON",
        "not representable as JSON",
    ),
    Case(
        "gcs-empty-folder",
        HEAD + "  storage: {path: 'gs://bucket//x'}\n",
        "spec.storage.path: 'gs://bucket//x' has an empty, '.' or '..' folder",
        "spec.storage.path",
    ),
    Case(
        "gcs-dot-dot",
        HEAD + "  storage: {path: 'gs://bucket/a/../b'}\n",
        "(hint: write gs://bucket/a/b)",
        "spec.storage.path",
    ),
    Case(
        "image-invalid",
        HEAD + "  image: 'not an image!'\n",
        "spec.image: 'not an image!' is not a valid container image reference",
        "spec.image",
    ),
    Case(
        "image-uppercase",
        HEAD + "  image: 'registry.example.com/Team/Train:1'\n",
        "(hint: image repository names are lowercase)",
        "spec.image",
    ),
    Case(
        "namespace-invalid",
        HEAD.replace("  name: bad\n", "  name: bad\n  namespace: Team_A\n"),
        "metadata.namespace: namespace 'Team_A' is not a valid namespace name",
        "metadata.namespace",
    ),
    Case(
        "tab-indent",
        HEAD + "  scaling:\n\tnumWorkers: 2\n",
        "(hint: indent with spaces; YAML does not allow tabs)",
        "YAML syntax error",
    ),
    Case(
        "duplicate-key",
        HEAD + "  suspend: true\n  suspend: false\n",
        "found duplicate key 'suspend'",
        "found duplicate key",
    ),
    Case("empty", "", "no TrainJob document found", "no TrainJob document found"),
    Case(
        "a-list",
        "- 1\n- 2\n",
        "a TrainJob document must be a mapping, got a list",
        "must be a mapping",
    ),
    Case(
        "snake-case",
        HEAD + "  scaling:\n    num_workers: 2\n",
        "spec.scaling.num_workers: unknown field 'num_workers' (hint: did you mean 'numWorkers'?",
        "did you mean 'numWorkers'?",
    ),
    Case(
        "env-valueFrom",
        HEAD
        + "  env:\n  - name: WANDB_API_KEY\n    valueFrom: {secretKeyRef: {name: s, key: k}}\n",
        None,
        "spec.env[0].valueFrom: WANDB_API_KEY comes from secretKeyRef, which only Kubernetes "
        "resolves (hint: export WANDB_API_KEY=... before trainjob run",
    ),
    Case(
        "env-valueFrom-two-sources",
        HEAD
        + "  env:\n  - name: A\n"
        + "    valueFrom: {secretKeyRef: {name: s, key: k}, fieldRef: {fieldPath: x}}\n",
        "spec.env[0].valueFrom: valueFrom must name exactly one source, got 'fieldRef', "
        "'secretKeyRef' (hint: use one of configMapKeyRef, fieldRef, resourceFieldRef, "
        "secretKeyRef)",
        "spec.env[0].valueFrom: valueFrom must name exactly one source",
    ),
    Case(
        "unreachable-store",
        HEAD + "  storage: {path: 'gs://trainjob-unreachable/runs'}\n",
        None,
        "TrainJob bad Failed: Training failed: cannot prepare the run folder "
        "gs://trainjob-unreachable/runs/bad: StorageError",
        run_exit=1,
        args=("--num-workers", "0"),
        env=(("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1"), ("TRAINJOB_GCS_ATTEMPTS", "1")),
    ),
]


def _trainjob(
    *args: str, cwd: Path, env: tuple[tuple[str, str], ...] = ()
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RANK"))}
    environ.pop("WANDB_API_KEY", None)
    environ["RAY_AUTH_MODE"] = "disabled"
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), environ.get("PYTHONPATH", "")])
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "trainjob_operator.cli", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


def _write(tmp_path: Path, case: Case) -> Path:
    path = tmp_path / f"{case.id}.yaml"
    if isinstance(case.manifest, bytes):
        path.write_bytes(case.manifest)
    else:
        path.write_text(case.manifest)
    return path


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_validate(case: Case, tmp_path: Path) -> None:
    path = _write(tmp_path, case)
    proc = _trainjob("validate", str(path), cwd=REPO_ROOT)
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output[-3000:]
    if case.validate is None or (case.validate_may_accept and proc.returncode == 0):
        assert proc.returncode == 0, output[-3000:]
        assert output.strip() == f"OK {path} (TrainJob/bad)"
        return
    assert proc.returncode == 2, output[-3000:]
    assert case.validate in output, output[-3000:]
    assert output.startswith(f"{path}: ")  # every line names the file, then the problem


@pytest.mark.slow  # trainjob run in a child process per case
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_run(case: Case, tmp_path: Path) -> None:
    path = _write(tmp_path, case)
    proc = _trainjob("run", str(path), *case.args, cwd=REPO_ROOT, env=case.env)
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output[-3000:]
    assert proc.returncode == case.run_exit, output[-3000:]
    assert case.run in proc.stderr, output[-3000:]
    if case.run_exit == 2:  # refused before anything started
        assert proc.stdout == ""


def test_validate_reads_no_more_than_the_cap(tmp_path: Path) -> None:
    """A huge file is refused after reading the cap, not loaded whole (a sparse 8 GiB file)."""
    path = tmp_path / "huge.yaml"
    with path.open("wb") as handle:
        handle.write(HEAD.encode())
        handle.truncate(8 * 2**30)
    proc = _trainjob("validate", str(path), cwd=REPO_ROOT)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the manifest is larger than 1572864 bytes" in proc.stdout


DEEP_METRICS = """\
import trainer_runtime as tr


def train(config):
    metrics = {}
    inner = metrics
    for _ in range(5000):
        inner["a"] = {}
        inner = inner["a"]
    with open(config["log"], "a") as log:
        log.write("attempt\\n")
    tr.report({"step": 0, "deep": metrics})
"""


@pytest.mark.ray
@pytest.mark.parametrize("num_workers", ["0", "1"])
def test_deep_metrics_fail_at_once_with_report_error(tmp_path: Path, num_workers: str) -> None:
    """A 5000-deep metrics dict is the user's ReportError, raised by report(): the run fails
    at once instead of spending failure.maxFailures on restarts."""
    (tmp_path / "deepmetrics.py").write_text(DEEP_METRICS)
    log = tmp_path / "attempts.log"
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        HEAD.replace("examples.quickstart.train:train_func", "deepmetrics:train")
        + f"  config: {{log: '{log}'}}\n"
        + f"  storage: {{path: '{tmp_path / 'runs'}'}}\n"
        + "  failure: {maxFailures: 3}\n"
        + "  scaling:\n    resourcesPerWorker: {cpu: '1'}\n"
    )
    proc = _trainjob("run", str(manifest), "--num-workers", num_workers, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert "ReportError" in output and "nested deeper than 32 levels" in output, output[-3000:]
    assert log.read_text() == "attempt\n"  # one attempt: not retried
    assert "RecursionError" not in output
