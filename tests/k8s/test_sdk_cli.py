"""The Python SDK and the cluster verbs of ``trainjob`` on a real kube-apiserver with the CRD
installed (no operator: the test plays it by patching the status subresource).

One namespace and one kubeconfig for the module. Covered: ``submit`` with a working dir (the
package lands content-addressed in storage and ``spec.runtimeEnv.workingDir`` names it),
``get``/``list``/``status``/``suspend``/``resume``/``delete``, ``wait`` and ``submit
--follow``'s display fed from the status and Events (exit 1 for a job deleted while followed),
and the refusals: each prints one line,
exits 2 and creates nothing (no kubeconfig, unknown context, missing namespace, RBAC denied,
working dir too large, entrypoint missing, invalid manifest, a name that exists).
"""

from __future__ import annotations

import io
import threading
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import EnvTest
from trainjob_operator import cli
from trainjob_operator.cluster_cli import follow
from trainjob_operator.constants import KIND
from trainjob_operator.kube import KubeClient, KubeConfig
from trainjob_operator.sdk import (
    InvalidTrainJob,
    PackagingError,
    TrainJobClient,
    TrainJobNotFound,
    WaitTimeout,
)

pytestmark = pytest.mark.k8s

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())


class Cluster:
    """What the module shares: the admin client, a namespace, a kubeconfig, a storage folder."""

    def __init__(self, env: EnvTest, root: Path) -> None:
        self.env = env
        self.admin = KubeClient(
            KubeConfig(host=env.host, token=env.token, ca_file=str(env.ca_file))
        )
        self.ns = f"sdk-{uuid.uuid4().hex[:8]}"
        self.admin.request(
            "POST", "/api/v1/namespaces", {"metadata": {"name": self.ns}, "apiVersion": "v1"}
        )
        self.kubeconfig = env.write_kubeconfig(root / "kubeconfig")
        self.alice = env.write_kubeconfig(root / "alice", user="alice")
        self.storage = root / "storage"
        self.storage.mkdir()
        self.client = TrainJobClient(namespace=self.ns, kubeconfig=self.kubeconfig)

    def names(self) -> list[str]:
        return [j["metadata"]["name"] for j in self.admin.list(KIND, self.ns)]

    def cli(self, *argv: str) -> list[str]:
        return [*argv, "-n", self.ns, "--kubeconfig", str(self.kubeconfig)]

    def manifest(self, root: Path, name: str, **spec: Any) -> Path:
        body = yaml.safe_load(yaml.safe_dump(QUICKSTART))
        body["metadata"]["name"] = name
        body["spec"]["storage"]["path"] = str(self.storage)
        body["spec"].update(spec)
        path = root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(body))
        return path


@pytest.fixture(scope="module")
def cluster(
    envtest: EnvTest, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    c = Cluster(envtest, tmp_path_factory.mktemp("sdk"))
    yield c
    c.admin.request("DELETE", f"/api/v1/namespaces/{c.ns}")


def _code(root: Path) -> Path:
    """A working dir holding the quickstart's entrypoint module (not the real one)."""
    pkg = root / "code" / "examples" / "quickstart"
    pkg.mkdir(parents=True, exist_ok=True)
    (root / "code" / "examples" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("def train_func(config):\n    pass\n")
    (root / "code" / ".gitignore").write_text("*.bin\n")
    (root / "code" / "weights.bin").write_bytes(b"x" * 1000)
    return root / "code"


def test_submit_with_a_working_dir_then_list_status_suspend_resume_delete(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = cluster.manifest(tmp_path, "wd", runtimeEnv={"excludes": ["notes/"]})
    code = _code(tmp_path)
    (code / "notes").mkdir()
    (code / "notes" / "draft.md").write_text("left out")
    assert cli.main(cluster.cli("submit", str(manifest), "--working-dir", str(code))) == 0
    out = capsys.readouterr().out
    job = cluster.client.get("wd")
    assert job.spec.runtime_env is not None
    uri = job.spec.runtime_env.working_dir
    assert (
        uri is not None and uri.startswith(f"{cluster.storage}/wd/_code/") and uri.endswith(".zip")
    )
    assert f"Uploaded {code} to {uri}" in out
    assert zipfile.ZipFile(uri).namelist() == [
        "working_dir/.gitignore",
        "working_dir/examples/__init__.py",
        "working_dir/examples/quickstart/__init__.py",
        "working_dir/examples/quickstart/train.py",
    ]

    assert [j.name for j in cluster.client.list()] == ["wd"]
    assert cli.main(cluster.cli("list")) == 0
    [header, row] = capsys.readouterr().out.splitlines()
    assert header.split() == ["NAME", "PHASE", "STEP", "METRICS", "BEST", "AGE"]
    assert row.split()[:2] == ["wd", "Pending"]

    assert cli.main(cluster.cli("suspend", "wd")) == 0
    assert cluster.client.get("wd").spec.suspend is True
    assert cli.main(cluster.cli("resume", "wd")) == 0
    assert cluster.client.get("wd").spec.suspend is False

    capsys.readouterr()
    assert cli.main(cluster.cli("status", "wd")) == 0
    assert capsys.readouterr().out.startswith(f"TrainJob {cluster.ns}/wd: Pending")

    # The same working dir again: the same digest (content-addressed), under the new job.
    again = cluster.client.submit(manifest, working_dir=code, name="wd2")
    assert again.spec.runtime_env is not None and again.spec.runtime_env.working_dir == (
        uri.replace("/wd/", "/wd2/")
    )

    capsys.readouterr()
    assert cli.main(cluster.cli("delete", "wd")) == 0
    cluster.client.delete("wd2")
    assert "wd" not in cluster.names()
    assert cli.main(cluster.cli("delete", "wd")) == 2
    assert capsys.readouterr().err.strip() == (
        f"trainjob: TrainJob {cluster.ns}/wd: not found in namespace '{cluster.ns}'"
    )


def test_follow_and_wait_read_the_status_and_events(cluster: Cluster, tmp_path: Path) -> None:
    job = cluster.client.submit(cluster.manifest(tmp_path, "fol"))
    with pytest.raises(WaitTimeout, match=r"still Pending after 0\.2s"):
        cluster.client.wait("fol", timeout=0.2, poll_interval=0.1)
    ckpt = f"{cluster.storage}/fol/checkpoint_000001"
    cluster.admin.patch(
        KIND,
        cluster.ns,
        "fol",
        {
            "status": {
                "phase": "Succeeded",
                "message": "training finished",
                "progress": {"step": 1, "metrics": {"train_loss": 0.5}},
                "latestCheckpoint": {"path": ckpt, "step": 1, "metrics": {"val_loss": 0.25}},
                "bestCheckpoint": {
                    "path": ckpt,
                    "step": 1,
                    "score": 0.25,
                    "metrics": {"val_loss": 0.25},
                },
                "validations": {"pending": 0, "running": 0, "done": 1, "failed": 0},
            }
        },
        subresource="status",
    )
    cluster.admin.request(
        "POST",
        f"/api/v1/namespaces/{cluster.ns}/events",
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "fol.1"},
            "involvedObject": {
                "apiVersion": "trainjob.dev/v1alpha1",
                "kind": KIND,
                "name": "fol",
                "namespace": cluster.ns,
                "uid": job.metadata.uid,
            },
            "reason": "Running",
            "message": "2 worker(s) ready",
            "type": "Normal",
        },
    )
    seen: list[str] = []
    done = cluster.client.wait(
        "fol", on_progress=lambda j: seen.append(str(j.status and j.status.phase))
    )
    assert done.status is not None and done.status.phase == "Succeeded" and seen == ["Succeeded"]
    out = io.StringIO()
    assert follow(cluster.client, "fol", out, io.StringIO(), poll_interval=0.1, live=False) == 0
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == [
        "Running: 2 worker(s) ready",
        "checkpoint_000001 committed (step 1: val_loss=0.25)",
        "checkpoint_000001 validated: val_loss=0.25 (best so far)",
        "Succeeded: step 1, 1 checkpoint(s) (1 validated), best checkpoint_000001 val_loss=0.25",
    ]
    with pytest.raises(TrainJobNotFound, match="no driver pod of rank 0 is running"):
        list(cluster.client.logs("fol"))
    cluster.client.delete("fol")


def test_follow_ends_with_1_when_the_job_is_deleted(cluster: Cluster, tmp_path: Path) -> None:
    cluster.client.submit(cluster.manifest(tmp_path, "gone"))
    out, err = io.StringIO(), io.StringIO()
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(
            follow(cluster.client, "gone", out, err, poll_interval=0.1, live=False)
        )
    )
    thread.start()
    cluster.admin.patch(
        KIND, cluster.ns, "gone", {"status": {"phase": "Running"}}, subresource="status"
    )
    deadline = time.monotonic() + 30
    while "Running" not in out.getvalue() and time.monotonic() < deadline:  # it follows
        time.sleep(0.05)
    cluster.client.delete("gone")
    thread.join(30)
    assert codes == [1]
    assert err.getvalue() == (
        f"trainjob: TrainJob {cluster.ns}/gone: deleted while it was followed (its storage is "
        "kept)\n"
    )


def test_bad_input_is_one_line_exit_2_and_creates_nothing(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = cluster.manifest(tmp_path, "bad")
    code = _code(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "main.py").write_text("")
    invalid = cluster.manifest(tmp_path, "invalid", scaling={"numWorkers": -1})
    # (manifest, options after the module's -n/--kubeconfig: the last one wins, words)
    cases = {
        "no kubeconfig": (manifest, ["--kubeconfig", str(tmp_path / "none")], "no kubeconfig"),
        "unknown context": (manifest, ["--context", "nope"], "no context 'nope'"),
        "missing namespace": (manifest, ["-n", "no-such-ns"], "does not exist"),
        "RBAC denied": (manifest, ["--kubeconfig", str(cluster.alice)], "forbidden by RBAC"),
        "entrypoint missing": (
            manifest,
            ["--working-dir", str(other)],
            "spec.entrypoint: module 'examples.quickstart.train' is not in the working dir",
        ),
        "invalid manifest": (invalid, [], "spec.scaling.numWorkers"),
    }
    for case, (path, options, words) in cases.items():
        assert cli.main([*cluster.cli("submit", str(path)), *options]) == 2, case
        captured = capsys.readouterr()
        assert captured.out == "", case
        [line] = captured.err.splitlines()
        assert line.startswith("trainjob: ") and words in line, (case, line)
    with pytest.raises(PackagingError, match="over the 0 MiB limit"):
        cluster.client.submit(manifest, working_dir=code, max_package_bytes=10)
    with pytest.raises(InvalidTrainJob, match="says 'elsewhere'"):
        cluster.client.submit(
            {
                **yaml.safe_load(manifest.read_text()),
                "metadata": {"name": "x", "namespace": "elsewhere"},
            }
        )
    assert not {"bad", "invalid", "x"} & set(cluster.names())
    assert not (cluster.storage / "bad").exists()
    # A name that exists: refused by the server's dry run, before any upload.
    cluster.client.submit(manifest)
    assert cli.main(cluster.cli("submit", str(manifest), "--working-dir", str(code))) == 2
    assert "already exists" in capsys.readouterr().err
    assert not (cluster.storage / "bad").exists()
    cluster.client.delete("bad")


def test_submit_follow_exits_1_when_the_job_fails(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def operator() -> None:  # plays the operator: the job fails once it exists
        deadline = time.monotonic() + 30
        while cluster.admin.get(KIND, cluster.ns, "ff") is None and time.monotonic() < deadline:
            time.sleep(0.1)
        cluster.admin.patch(
            KIND,
            cluster.ns,
            "ff",
            {"status": {"phase": "Failed", "message": "the driver exited 1"}},
            subresource="status",
        )

    thread = threading.Thread(target=operator)
    thread.start()
    try:
        code = cli.main(cluster.cli("submit", str(cluster.manifest(tmp_path, "ff")), "--follow"))
    finally:
        thread.join()
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert out[0] == f"trainjob.trainjob.dev/ff created in namespace {cluster.ns}"
    assert out[-1].endswith("] Failed: the driver exited 1")
    cluster.client.delete("ff")


def test_the_api_server_keeps_every_runtime_env_field(cluster: Cluster) -> None:
    """The CRD's schema has spec.runtimeEnv (a field it lacked would be pruned silently): the
    guide's example round-trips."""
    body = yaml.safe_load((REPO / "docs" / "snippets" / "runtime-env.yaml").read_text())
    created = cluster.client.submit(body)
    stored = cluster.admin.get(KIND, cluster.ns, created.name)
    assert stored is not None
    assert stored["spec"]["runtimeEnv"] == body["spec"]["runtimeEnv"]
    cluster.client.delete(created.name)
