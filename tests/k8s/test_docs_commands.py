"""The shell commands of the guides run, against a real kube-apiserver with the TrainJob CRD.

Every command of every ``bash`` block of the README and the hand-written pages is either run
here, as written, or listed in ``tests/docs/_commands.py``'s ``NOT_RUN`` with the reason and
where what it does is tested instead (``test_snippets.py::test_every_command_is_run_or_listed``
keeps the table complete and without stale entries). They run once for the module
(:func:`ran`), block after block in the order of the pages, each line in ``bash`` from a scratch
folder holding copies of ``examples/``, ``charts/`` and ``crds/``, with:

* ``kubectl``: the node tier's kubectl 1.20 (``scripts/provision-node.sh``) when it is there,
  else the one on ``PATH``, with ``KUBECONFIG`` pointing at the session's envtest (the ``k8s``
  tier's kube-apiserver + etcd + kube-controller-manager; no scheduler, no kubelet: no pod runs).
* ``helm``: ``install``/``upgrade``/``uninstall`` through Helm's Go SDK
  (:mod:`tests.docs.helm_cli`; no helm binary is needed). A release is uninstalled once what it
  installed is checked: the chart's admission webhook (``failurePolicy: Fail``) would refuse
  every later TrainJob, since envtest runs no operator pod to answer it.
* ``trainjob``: this checkout's CLI (``.venv/bin/trainjob``).

The placeholders of the guides: ``my-job.yaml`` is ``examples/quickstart.yaml`` renamed
``my-job``; ``$REGISTRY`` is ``registry.example.com``. ``kubectl get ... -w`` lists once (a
watch never ends). What the commands leave (namespaces, TrainJobs) is deleted afterwards.

The TrainJob manifests the pages include go through ``kubectl apply --dry-run=server`` too.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.docs._commands import Command, commands, not_run
from tests.docs._gen import REPO, blocks
from tests.support import EnvTest

REGISTRY = "registry.example.com"


@dataclass
class Ran:
    command: Command  # the guide's
    text: str  # what bash ran
    returncode: int
    output: str


def _kubectl() -> str | None:
    from tests.support.node import cache_dir

    node_kubectl = cache_dir() / "bin" / "kubectl"
    return str(node_kubectl) if node_kubectl.is_file() else shutil.which("kubectl")


def _scratch(folder: Path) -> Path:
    for name in ("examples", "charts", "crds"):
        shutil.copytree(REPO / name, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
    job = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    job["metadata"]["name"] = "my-job"
    (folder / "my-job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return folder


def _env(envtest: EnvTest, bin_dir: Path) -> dict[str, str]:
    kubectl = _kubectl()
    if kubectl is None:
        pytest.skip("no kubectl: scripts/provision-node.sh puts kubectl 1.20 in the node cache")
    (bin_dir / "kubectl").symlink_to(kubectl)
    helm = bin_dir / "helm"
    helm.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tests.docs.helm_cli "$@"\n')
    helm.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    return {
        **os.environ,
        "PATH": path,
        "KUBECONFIG": str(envtest.kubeconfig),
        "PYTHONPATH": str(REPO),
        "REGISTRY": REGISTRY,
    }


def _as_run(text: str) -> str:
    """The command as it runs here: a ``kubectl`` watch (``-w``) lists once."""
    return re.sub(r" -w\b", "", text) if text.startswith("kubectl ") else text


class _Runner:
    def __init__(self, scratch: Path, env: dict[str, str]) -> None:
        self.scratch = scratch
        self.env = env
        self.results: list[Ran] = []

    def bash(self, text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-o", "pipefail", "-c", text],
            cwd=self.scratch,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def run(self, command: Command, text: str) -> Ran:
        done = self.bash(text)
        ran = Ran(command, text, done.returncode, done.stdout + done.stderr)
        self.results.append(ran)
        return ran


@pytest.fixture(scope="module")
def ran(envtest: EnvTest, crd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Runner]:
    """Every command that runs here, run once, in order (``.results``)."""
    runner = _Runner(
        _scratch(tmp_path_factory.mktemp("guides")),
        _env(envtest, tmp_path_factory.mktemp("bin")),
    )
    installed: set[str] = set()  # releases not uninstalled yet: "NAME -n NAMESPACE"
    try:
        for command in commands():
            if not_run(command) is not None:
                continue
            done = runner.run(command, _as_run(command.text))
            argv = shlex.split(done.text)
            if argv[:2] == ["helm", "install"] and done.returncode == 0:
                # what it installed, then gone: its webhook would refuse the next TrainJobs
                namespace = re.search(r"^NAMESPACE: (\S+)$", done.output, re.MULTILINE)
                assert namespace is not None, done.output
                where = f"-n {namespace.group(1)}"
                installed.add(f"{argv[2]} {where}")
                runner.run(command, f"kubectl {where} get deployment,service,secret")
                if runner.run(command, f"helm uninstall {argv[2]} {where}").returncode == 0:
                    installed.discard(f"{argv[2]} {where}")
        yield runner
    finally:
        for release in installed:
            runner.bash(f"helm uninstall {release}")
        for leftover in (
            "kubectl delete trainjob my-job --ignore-not-found",
            "kubectl delete namespace training trainjob-system --ignore-not-found --wait=false",
        ):
            with contextlib.suppress(subprocess.SubprocessError):
                runner.bash(leftover)


def test_the_guides_commands_run_against_the_api_server(ran: _Runner) -> None:
    results = ran.results
    failed = [r for r in results if r.returncode != 0]
    assert not failed, "\n\n".join(
        f"{r.command.where}\n  ran: {r.text}\n  exit {r.returncode}:\n{r.output}" for r in failed
    )
    outputs: dict[str, str] = {}  # the first run of each command
    for r in results:
        outputs.setdefault(r.text, r.output)
    # the chart installed, its Deployment there, then uninstalled, once per guide
    installs = [r for r in results if r.text.startswith("helm install")]
    assert len(installs) == 2
    assert all("STATUS: deployed" in r.output for r in installs)
    check = "kubectl -n trainjob-system get deployment,service,secret"
    assert "deployment.apps/trainjob-operator" in outputs[check]
    assert (
        'release "trainjob-operator" uninstalled'
        in outputs["helm uninstall trainjob-operator -n trainjob-system"]
    )
    # the TrainJobs the guides apply were stored, patched and deleted by the API server
    assert "trainjob.trainjob.dev/my-job created" in outputs["kubectl apply -f my-job.yaml"]
    patched = [r.output for r in results if r.text.startswith("kubectl patch tj my-job")]
    assert patched == ["trainjob.trainjob.dev/my-job patched\n"] * 2
    assert 'trainjob.trainjob.dev "my-job" deleted' in outputs["kubectl delete tj my-job"]
    assert "llm-v6e-4x4" in outputs["kubectl -n training get tj llm-v6e-4x4"]


def test_trainjob_crd_writes_the_committed_crd(ran: _Runner) -> None:
    """``trainjob crd > crds/trainjob.dev_trainjobs.yaml`` (the local guide) regenerates the
    committed file unchanged."""
    name = "crds/trainjob.dev_trainjobs.yaml"
    assert (ran.scratch / name).read_text() == (REPO / name).read_text()


def test_the_sed_of_the_tpu_guide_changed_the_image(ran: _Runner) -> None:
    job = yaml.safe_load((ran.scratch / "examples" / "tpu-v6e-4x4.yaml").read_text())
    assert job["spec"]["image"] == "REGISTRY/trainjob-runtime:0.1.0-tpu"  # the one it built


def test_the_manifests_the_guides_show_pass_the_api_servers_schema(ran: _Runner) -> None:
    """The TrainJobs the pages include (and ``examples/``) as ``kubectl apply --dry-run=server``
    takes them: the CRD's schema accepts each, except ``bad-trainjob.yaml``, the local guide's
    manifest with mistakes (kubectl refuses its unknown field, the API server its entrypoint)."""
    included = {
        body[0].split('"')[1].split(":")[0]  # --8<-- "name" or "name:section"
        for _, _, language, body in blocks()
        if language == "yaml" and len(body) == 1 and body[0].startswith('--8<-- "')
    }
    snippets = REPO / "docs" / "snippets"
    paths = {str(REPO / n if (REPO / n).is_file() else snippets / n) for n in included}
    paths |= {str(p) for p in (REPO / "examples").glob("*.yaml")}
    bad = str(snippets / "bad-trainjob.yaml")
    assert bad in paths and len(paths) >= 5
    # The namespaces the manifests name exist where they are applied (Argo CD's own install
    # makes `argocd`, which the argocd-cm snippet patches).
    named = {
        doc["metadata"]["namespace"]
        for path in paths
        for doc in yaml.safe_load_all(Path(path).read_text())
        if doc and doc.get("metadata", {}).get("namespace")
    }
    for namespace in sorted(named):
        ran.bash(f"kubectl create namespace {namespace}")  # already there: harmless
    for path in sorted(paths):
        done = ran.bash(f"kubectl apply --dry-run=server -f {path}")
        if path == bad:  # as the local guide says: kubectl's check, then the API server's
            assert done.returncode != 0 and 'unknown field "num_workers"' in done.stderr, done
            done = ran.bash(f"kubectl apply --validate=false --dry-run=server -f {path}")
            assert done.returncode != 0 and "spec.entrypoint" in done.stderr, done
        else:
            assert done.returncode == 0, done.stderr
            assert "(server dry run)" in done.stdout
