"""``trainjob submit --follow`` and ``trainjob dashboard`` as a person sees them, against a
real kube-apiserver with the operator running (in-process, as in ``test_operator.py``).

``submit --follow`` runs in a tmux pane (a terminal: the live status line) with a user's
environment, and the pane is read. There is no kubelet and no Ray: the test plays the kubelet
(pod phases) and the driver (its real :class:`~trainjob_operator.launcher.driver.StatusPublisher`
patching progress and checkpoints into the status), so what the screen shows comes from the
operator's own phases, messages and Events and the driver's own status keys.
``dashboard`` runs a real ``kubectl port-forward``, which resolves the job's dashboard Service
to its head pod (Pending here: no kubelet).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.k8s.test_operator import (
    RunningOperator,
    by_role,
    job_status,
    make_all_ready,
    pods,
    remove_trainjobs,
    set_pod_phase,
)
from tests.support import EnvTest
from tests.support.waiting import wait_for
from tests.test_run_terminal import TMUX, Pane
from trainer_runtime.checkpoint_manager import CheckpointRecord, CheckpointStatus
from trainjob_operator.kube import KubeClient, KubeConfig
from trainjob_operator.launcher.driver import StatusPublisher

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(
        TMUX is None,
        reason="tmux is not installed (make test installs it with apt-get when run as root)",
    ),
]

REPO = Path(__file__).resolve().parents[2]
SNIPPET = REPO / "docs" / "snippets" / "submit-follow.txt"
TRAINJOB = Path(sys.executable).with_name("trainjob")
# The live status line: "[   4.2s] Starting 2 worker(s)", "[  9.0s] Running | step 1: ...".
LIVE_LINE = re.compile(r"^\[ *[\dhms.]+\] (Starting \d+ worker|\w+( \||$))")
ELAPSED = re.compile(r"^\[ *[\dhms.]+\]")


class Setup:
    """The module's namespace, operator, admin client, kubeconfig and user environment."""

    def __init__(self, envtest: EnvTest, root: Path) -> None:
        self.root = root
        self.admin = KubeClient(
            KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))
        )
        self.ns = f"follow-{uuid.uuid4().hex[:8]}"
        self.admin.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "metadata": {"name": self.ns}}
        )
        self.operator = RunningOperator(envtest, self.ns)
        self.kubeconfig = envtest.write_kubeconfig(root / "kubeconfig")
        drop = ("CI", "PYTHONPATH", "TMUX", "TMUX_PANE", "KUBECONFIG")
        self.env = {
            k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST")
        }
        self.env["TERM"] = "xterm-256color"

    def trainjob(self, *argv: str) -> str:
        """A shell command line running ``trainjob ARGV -n NS --kubeconfig FILE``."""
        program = (
            str(TRAINJOB) if TRAINJOB.exists() else f"{sys.executable} -m trainjob_operator.cli"
        )
        return f"{program} {' '.join(argv)} -n {self.ns} --kubeconfig {self.kubeconfig}"

    def manifest(self, name: str, **spec: object) -> Path:
        body = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
        body["metadata"]["name"] = name
        body["spec"]["storage"]["path"] = str(self.root / "storage")
        body["spec"].update(spec)
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(body))
        return path

    def pane(self, name: str, command: str) -> Pane:
        """``command`` in a new terminal, then its exit status as ``[exit N]``."""
        full = f'cd {self.root} && {command}; echo "[exit $?]"; sleep 600'
        return Pane(self.root / f"{name}.sock", full, self.env)


@pytest.fixture(scope="module")
def setup(envtest: EnvTest, crd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    s = Setup(envtest, tmp_path_factory.mktemp("follow"))
    s.operator.start()
    try:
        yield s
    finally:
        remove_trainjobs(envtest, s.ns)
        s.operator.stop()
        s.admin.request("DELETE", f"/api/v1/namespaces/{s.ns}")


class Screen:
    """A pane read every 0.2 s while waiting; every screen seen is kept."""

    def __init__(self, pane: Pane) -> None:
        self.pane = pane
        self.seen: list[str] = []

    def until(self, what: str, check: Callable[[str], bool], timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.pane.capture()
            self.seen.append(screen)
            if check(screen):
                return screen
            assert time.monotonic() < deadline, f"waited for {what}; the screen:\n{screen}"
            time.sleep(0.2)

    def live_lines(self) -> list[str]:
        """The live status line of each screen seen (checking there is at most one, last)."""
        shown = []
        for screen in self.seen:
            lines = [line.rstrip() for line in screen.splitlines() if line.strip()]
            live = [line for line in lines if LIVE_LINE.match(line)]
            assert len(live) <= 1, screen
            if live:
                assert lines[-1] == live[0], screen  # below the event lines
                shown.append(live[0])
        return shown


def record(name: str, step: int, metrics: dict[str, float]) -> CheckpointRecord:
    return CheckpointRecord(
        name,
        f"/tmp/trainjob-runs/my-job/{name}",
        step,
        {"epoch": step, **metrics},
        status=CheckpointStatus.PENDING_VALIDATION,
    )


def validated(record: CheckpointRecord, **metrics: float) -> CheckpointRecord:
    record.status = CheckpointStatus.VALIDATED
    record.validation_metrics = metrics
    return record


def shown(lines: list[str], ns: str) -> list[str]:
    """What the guide shows of ``lines``: elapsed times as ``[   t]``, the namespace team-a."""
    return [ELAPSED.sub("[   t]", line).replace(ns, "team-a") for line in lines]


def test_submit_follow_on_a_terminal_to_succeeded(setup: Setup) -> None:
    """The live line redrawn in place while the job starts, runs and reports; the event lines
    and the outcome stay; exit status 0. The screen is the guide's capture
    (docs/snippets/submit-follow.txt)."""
    ns, admin = setup.ns, setup.admin
    setup.manifest("my-job")
    pane = setup.pane("ok", setup.trainjob("submit", "my-job.yaml", "--follow"))
    screen = Screen(pane)
    try:
        screen.until("created", lambda s: "created in namespace" in s)
        wait_for("2 workers", lambda: len(by_role(admin, ns, "worker", "my-job")) == 2)
        screen.until("Starting", lambda s: "Starting 2 worker(s)" in s)
        make_all_ready(admin, ns, "my-job")
        screen.until("Running", lambda s: bool(re.search(r"\] Running$", s, re.M)))

        # The driver's own status publisher, as in the driver pod; each change waits for the
        # screen, so that each is a poll of its own (as minutes apart in a real run).
        driver = StatusPublisher(admin, ns, "my-job", "val_loss", min_interval=0.1)
        first = record("checkpoint_000000", 0, {"train_loss": 0.618})
        second = record("checkpoint_000001", 1, {"train_loss": 0.4088})
        driver.on_report(0, {"epoch": 0, "train_loss": 0.618})
        driver.on_checkpoint(first, None)
        screen.until("a commit", lambda s: "checkpoint_000000 committed" in s)
        driver.on_report(1, {"epoch": 1, "train_loss": 0.4088})
        driver.on_checkpoint(second, None)
        screen.until("a second commit", lambda s: "checkpoint_000001 committed" in s)
        driver.on_checkpoint(validated(first, val_loss=0.5395, val_accuracy=0.6499), first)
        screen.until("a validation", lambda s: "checkpoint_000000 validated" in s)
        driver.on_checkpoint(validated(second, val_loss=0.2841, val_accuracy=0.9282), second)
        screen.until("a better one", lambda s: "checkpoint_000001 validated" in s)
        driver.close()
        screen.until("the live line", lambda s: "checkpoints 2 (2 validated) | best" in s)

        set_pod_phase(admin, ns, by_role(admin, ns, "driver", "my-job")[0], "Succeeded")
        screen.until("exit", lambda s: "[exit " in s)
        final = pane.capture(history=True)
    finally:
        pane.close()

    lines = [line.rstrip() for line in final.splitlines() if line.strip()]
    text = "\n".join(lines)
    assert lines[-1] == "[exit 0]", text
    # While it ran: one live line, at the bottom, redrawn in place as the status changed.
    live = screen.live_lines()
    assert any(line.endswith("] Starting 2 worker(s)") for line in live), live
    assert any(line.endswith("] Running") for line in live), live
    assert any(
        "] Running | step 1: epoch=1 train_loss=0.4088 | checkpoints 2 (2 validated) | best" in line
        for line in live
    ), live
    # After it: the event lines and the outcome stay, the live line is gone.
    assert not [line for line in lines if LIVE_LINE.match(line)], text
    if os.environ.get("TRAINJOB_WRITE_SNIPPETS") == "1":  # to refresh the guide's capture
        SNIPPET.write_text("\n".join(line.replace(ns, "team-a") for line in lines[:-1]) + "\n")
    assert shown(lines[:-1], ns) == shown(SNIPPET.read_text().splitlines(), ns), text


def test_ctrl_c_stops_following_not_the_job(setup: Setup) -> None:
    ns, admin = setup.ns, setup.admin
    setup.manifest("my-job-2")
    pane = setup.pane("ctrl-c", setup.trainjob("submit", "my-job-2.yaml", "--follow"))
    screen = Screen(pane)
    try:
        wait_for("2 workers", lambda: len(by_role(admin, ns, "worker", "my-job-2")) == 2)
        make_all_ready(admin, ns, "my-job-2")
        screen.until("Running", lambda s: bool(re.search(r"\] Running$", s, re.M)))
        subprocess.run([*pane.base, "send-keys", "-t", "run", "C-c"], check=True, timeout=30)
        screen.until("exit", lambda s: "[exit " in s)
        final = pane.capture(history=True)
    finally:
        pane.close()
    lines = [line.rstrip() for line in final.splitlines() if line.strip()]
    text = "\n".join(lines)
    assert lines[-1] == "[exit 130]", text
    assert lines[-2] == (
        f"Stopped following TrainJob {ns}/my-job-2; it keeps running. Follow it again: "
        f"trainjob logs -n {ns} my-job-2 -f; stop it: trainjob delete -n {ns} my-job-2 (or "
        f"trainjob suspend -n {ns} my-job-2 to keep its pods' capacity free and resume later)."
    ), text
    assert not [line for line in lines if LIVE_LINE.match(line)], text  # taken off the screen
    job = admin.get("TrainJob", ns, "my-job-2")
    assert job is not None and not job["spec"].get("suspend")
    assert (job.get("status") or {}).get("phase") == "Running"
    assert len(by_role(admin, ns, "worker", "my-job-2")) == 2


def _kubectl() -> str | None:
    """The node tier's kubectl 1.20 when provisioned (the API server's version), else PATH's."""
    from tests.support.node import cache_dir

    node_kubectl = cache_dir() / "bin" / "kubectl"
    return str(node_kubectl) if node_kubectl.is_file() else shutil.which("kubectl")


def test_dashboard_refuses_without_a_service_then_port_forwards_to_the_head(
    setup: Setup, tmp_path: Path
) -> None:
    """No dashboard Service: one line with the fix and exit 2; the fix (a kubectl patch) adds
    the Service without touching the pods; then ``trainjob dashboard`` runs a real ``kubectl
    port-forward``, which finds the head pod behind the Service (Pending: no kubelet here, so
    kubectl stops there, exit 1), and its token command reads the job's token."""
    kubectl = _kubectl()
    if kubectl is None:
        pytest.skip("no kubectl: scripts/provision-node.sh puts kubectl 1.20 in the node cache")
    (tmp_path / "kubectl").symlink_to(kubectl)
    env = {
        **setup.env,
        "PATH": os.pathsep.join([str(tmp_path), str(TRAINJOB.parent), os.environ["PATH"]]),
        "KUBECONFIG": str(setup.kubeconfig),
    }
    ns, admin = setup.ns, setup.admin
    admin.create(yaml.safe_load(setup.manifest("dash").read_text()), ns)
    wait_for("the pods", lambda: len(pods(admin, ns, "dash")) == 4)
    before = pods(admin, ns, "dash")

    def trainjob(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", setup.trainjob(*argv)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    refused = trainjob("dashboard", "dash")
    assert (refused.returncode, refused.stdout) == (2, ""), refused
    [line] = refused.stderr.splitlines()
    assert line.startswith(f"trainjob: TrainJob {ns}/dash: it has no dashboard Service; "), line
    fix = line.split("add one (its pods keep running): ", 1)[1]
    subprocess.run(["bash", "-c", fix], env=env, check=True, capture_output=True, timeout=60)
    wait_for("status.dashboard", lambda: (job_status(admin, ns, "dash")).get("dashboard"))
    after = pods(admin, ns, "dash")
    assert {n: p["metadata"]["uid"] for n, p in after.items()} == {
        n: p["metadata"]["uid"] for n, p in before.items()
    }

    forwarded = trainjob("dashboard", "dash", "--port", "18265")
    out = forwarded.stdout.splitlines()
    assert out[0] == f"Ray dashboard of {ns}/dash: http://127.0.0.1:18265 (Ctrl-C stops)"
    # kubectl resolved svc/dash-dashboard (in the namespace, with the kubeconfig given) to the
    # head pod, which is not running here
    assert forwarded.returncode == 1, forwarded
    assert "unable to forward port because pod is not running" in forwarded.stderr, forwarded
    token = subprocess.run(
        ["bash", "-c", out[1].removeprefix("Its auth token: ")],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    secret = admin.get("Secret", ns, "dash-ray-auth")
    assert (
        secret is not None and token and base64.b64decode(secret["data"]["token"]).decode() == token
    )
