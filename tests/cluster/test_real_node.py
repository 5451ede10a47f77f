"""TrainJobs trained in real containers on a real node (:mod:`tests.support.node`).

Everything is real: the images are built from the repository's Dockerfile, the chart is
installed with Helm's SDK (the CRD, the operator's RBAC, its Deployment: the operator runs in
its own container with its ServiceAccount's token), fake-gcs-server runs in the cluster behind
a Service, the scheduler places the pods, the kubelet runs them in containerd, pods find each
other through Services and cluster DNS, and Ray, torch gloo DDP, JAX (``jax.distributed`` in
the Dockerfile's JAX variant), checkpoints and validations run inside the containers.

The scenarios share one node and one Helm release and run at the same time, each in a namespace
of its own (:mod:`tests.support.concurrent`): they mostly wait (on pods starting, on a deadline,
on a grace period), and their pods ask for tenths of a CPU, so the node holds several at once.
Each is still a test of its own: ``test_scenario[NAME]`` fails with its scenario's traceback
and a dump of its namespace (the TrainJob, pods, Events, logs, the operator's log).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest
import yaml
from kubernetes import client as k8s_client

from tests.cluster.conftest import JAX_IMAGE
from tests.support.concurrent import RunningScenarios, ScenarioSet
from tests.support.node import Image, Node
from tests.support.real_cluster import (
    DRIVER_RESOURCES,
    GCS_HOST,
    GCS_PORT,
    GRACEFUL_TERMINATION,
    JOB,
    OPERATOR_NAMESPACE,
    POD_CPU,
    RELEASE,
    REPO,
    Cluster,
    checkpoint_folders,
    job_manifest,
    kill_in_container,
    make_job,
    ready_cluster,
    terminate_a_worker_pod_gracefully,
    wait_for_a_committed_checkpoint,
)
from tests.support.waiting import wait_for, wait_for_suite_gate
from trainer_runtime.checkpoint import COMMIT_MARKER
from trainer_runtime.storage.factory import reset_storage_cache
from trainjob_operator.sdk import TrainJobClient

pytestmark = [pytest.mark.node, pytest.mark.timeout(1500)]

JAX_EXAMPLE = yaml.safe_load((REPO / "examples" / "jax.yaml").read_text())
MAX_SCENARIOS_AT_ONCE = 3
"""Scenarios running together: each job's pods take about 2 GiB of memory and, while they start,
most of a core."""

T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(node: Node, node_images: dict[str, Image]) -> Iterator[Cluster]:
    """The node with the chart and fake-gcs-server. This process reaches fake-gcs-server
    through its bridge as the pods reach it through the Service: ``STORAGE_EMULATOR_HOST``
    names the bridge here, for what reads or writes gs:// through
    :mod:`trainer_runtime.storage` (the SDK's upload of a working dir,
    ``TrainJobClient.result``, the ``trainjob`` commands run from here)."""
    with ready_cluster(node, node_images) as env, pytest.MonkeyPatch.context() as patch:
        patch.setenv("STORAGE_EMULATOR_HOST", env.gcs_url)
        reset_storage_cache()
        yield env
    reset_storage_cache()


class Scene(NamedTuple):
    """What a scenario gets: the cluster and a namespace of its own."""

    cluster: Cluster
    namespace: str


SCENARIOS = ScenarioSet[Scene]()
scenario = SCENARIOS.register


@contextlib.contextmanager
def in_a_namespace(cluster: Cluster, scenario_name: str) -> Iterator[Scene]:
    """A new namespace for one scenario; on failure the error carries a dump of it; deleted
    afterwards (the operator's finalizers run while the operator is there)."""
    name = f"real-{uuid.uuid4().hex[:8]}"
    cluster.core.create_namespace({"metadata": {"name": name, "labels": {"scenario": "yes"}}})
    try:
        yield Scene(cluster, name)
    except BaseException as error:
        with contextlib.suppress(Exception):
            error.add_note(f"----- namespace {name} ({scenario_name}) -----\n{cluster.dump(name)}")
        raise
    finally:
        cluster.node.kubectl("delete", "tj", "--all", "-n", name, "--wait=false", check=False)
        with contextlib.suppress(k8s_client.ApiException):
            cluster.core.delete_namespace(name)


@pytest.fixture(scope="module")
def scenarios(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[RunningScenarios]:
    """Every selected scenario of this module, started together, in the order they are
    registered: the longest first, so that the short ones fill the gaps at the end."""
    selected = set(SCENARIOS.selected(request.session, __name__))
    names = [name for name in SCENARIOS.names() if name in selected]
    # Under `make test` the node and the chart were set up while the Ray tier ran; the
    # scenarios, which load both cores, start once it ended.
    wait_for_suite_gate("the real-node scenarios")
    with SCENARIOS.start(
        names, lambda name: in_a_namespace(cluster, name), max_at_once=MAX_SCENARIOS_AT_ONCE
    ) as running:
        yield running


RAY_DATA_VALIDATION = {
    "entrypoint": "examples.quickstart.train:validate_with_ray_data",
    "pool": {"minReplicas": 0, "maxReplicas": 1, "resources": {"cpu": POD_CPU}, "spot": False},
}
"""The quickstart scenario's validation: scored with Ray Data on a pool pod of one CPU."""

DATA_DRIVER_RESOURCES = {"cpu": POD_CPU, "memory": "1Gi"}
"""The quickstart scenario's ``spec.ray.driver.resources``: its ``spec.data`` datasets hold their
rows in the driver node's object store (the chart's default here, 512Mi, ran out of memory)."""


def test_operator_runs_in_cluster_from_its_image(cluster: Cluster) -> None:
    pods = cluster.core.list_namespaced_pod(OPERATOR_NAMESPACE).items
    assert pods
    for pod in pods:
        assert pod.status.phase == "Running"
        [container] = pod.spec.containers
        assert container.image == cluster.images["operator"].name
        assert pod.spec.service_account_name == RELEASE
        assert pod.spec.security_context.run_as_non_root
    crd = cluster.node.kubectl("get", "crd", "trainjobs.trainjob.dev", "-o", "name").stdout
    assert crd.strip() == "customresourcedefinition.apiextensions.k8s.io/trainjobs.trainjob.dev"


WORKING_DIR_MODULE = "mytrain"
"""The quickstart's code under a name that is not in the image: a job whose entrypoint is in
it runs only if its working dir reached the pods."""


TRAINJOB_CLI = str(Path(sysconfig.get_path("scripts")) / "trainjob")
"""The ``trainjob`` command of this environment."""


def _cli_args(cluster: Cluster, command: list[str], namespace: str) -> list[str]:
    return [*command, "-n", namespace, "--kubeconfig", str(cluster.node.kubeconfig)]


def _cli_env() -> dict[str, str]:
    """This environment's scripts folder (``kubectl-trainjob``, ``trainjob``) first on PATH."""
    scripts = sysconfig.get_path("scripts")
    return {**os.environ, "PATH": os.pathsep.join([scripts, os.environ.get("PATH", "")])}


def _cli(cluster: Cluster, command: list[str], namespace: str) -> subprocess.CompletedProcess[str]:
    """A ``trainjob`` command of this environment against the node, in ``namespace``."""
    result = subprocess.run(
        _cli_args(cluster, command, namespace),
        capture_output=True,
        text=True,
        env=_cli_env(),
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stderr}"
    return result


@scenario
def worker_terminated_without_preemption_budget_restarts_then_suspend_and_resume_continue(
    scene: Scene,
) -> None:
    """Submitted as from a laptop (issue 37): ``trainjob submit --working-dir DIR --follow``
    with a working dir whose module is not in the image (:data:`WORKING_DIR_MODULE`), uploaded
    from here to fake-gcs-server; each driver fetches it. With ``failure.maxPreemptionFailures:
    0`` and ``maxRestarts: 0``, a worker pod terminated gracefully after a checkpoint makes the
    driver commit a last checkpoint and exit 3, and the operator restarts the whole job from it
    without counting it (maxRestarts 0 would fail the job); ``kubectl describe tj`` shows the
    restart history. Once the restarted driver resumed, ``spec.suspend`` tears every pod down
    and resuming continues from the latest checkpoint to Succeeded. Then the cluster verbs read
    the run: ``kubectl trainjob logs`` (kubectl finds the plugin on PATH) shows the driver's
    log, ``trainjob logs --role worker --rank 1`` a worker's (while Running), ``trainjob logs
    -f`` streams the resumed driver's log while it trains and exits 0 when the driver ends,
    ``submit --follow`` showed the progress lines to ``Succeeded`` and exited 0,
    ``TrainJobClient.result`` and ``trainjob checkpoints`` list the checkpoints committed in
    storage."""
    cluster, namespace = scene
    epochs = 6
    body, bucket = job_manifest(
        cluster,
        namespace,
        {"epochs": epochs, "batch_size": 8, **GRACEFUL_TERMINATION["config"]},
        entrypoint=f"{WORKING_DIR_MODULE}.train:train_func",
        failure={"maxRestarts": 0, "maxPreemptionFailures": 0},
        podTemplate=GRACEFUL_TERMINATION["podTemplate"],
    )
    client = TrainJobClient(namespace=namespace, kubeconfig=cluster.node.kubeconfig)
    # `trainjob submit MANIFEST --working-dir DIR --follow` as a user runs it, following the
    # job (plain lines: no terminal) until it ends, through the restart and the suspension.
    scratch = Path(tempfile.mkdtemp(prefix="trainjob-submit-"))
    shutil.copytree(
        REPO / "examples" / "quickstart",
        scratch / "code" / WORKING_DIR_MODULE,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    manifest = scratch / "trainjob.yaml"
    manifest.write_text(yaml.safe_dump(body))
    submit_out = scratch / "submit.out"
    with submit_out.open("w") as out:
        submit_argv = [TRAINJOB_CLI, "submit", str(manifest), "--follow"]
        submit_argv += ["--working-dir", str(scratch / "code")]
        submitted = subprocess.Popen(
            _cli_args(cluster, submit_argv, namespace),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=_cli_env(),
        )

    def created() -> Any:
        if submitted.poll() not in (None, 0):
            raise AssertionError(
                f"trainjob submit exited {submitted.returncode}: " + submit_out.read_text()[-3000:]
            )
        return next((j for j in client.list() if j.name == JOB), None)

    job = wait_for("the TrainJob trainjob submit created", created, timeout=180, every=1.0)
    assert job.spec.runtime_env is not None
    uploaded = job.spec.runtime_env.working_dir or ""
    assert uploaded.startswith(f"gs://{bucket}/runs/{JOB}/_code/"), uploaded
    assert cluster.gcs().bucket(bucket).blob(uploaded.removeprefix(f"gs://{bucket}/")).exists()
    wait_for_a_committed_checkpoint(cluster, namespace)
    # The second worker's pod (rank 1: <job>-w1) as the CLI shows it: its log so far, which
    # kubectl's (read after it, logs only grow) starts with.
    worker_log = _cli(
        cluster, [TRAINJOB_CLI, "logs", JOB, "--role", "worker", "--rank", "1"], namespace
    ).stdout
    from_kubectl = cluster.node.kubectl("logs", "-n", namespace, f"{JOB}-w1").stdout
    assert worker_log.strip() and from_kubectl.startswith(worker_log), (worker_log, from_kubectl)

    # No preemption budget: the whole job restarts, and its new driver resumes.
    terminate_a_worker_pod_gracefully(cluster, namespace)
    wait_for(
        "the restarted driver resuming from the checkpoint",
        lambda: (
            "Resuming run"
            in cluster.node.kubectl("logs", "-n", namespace, f"{JOB}-driver", check=False).stdout
        ),
        timeout=600,
        every=2.0,
    )
    patch = {"spec": {"suspend": True}}
    cluster.custom.patch_namespaced_custom_object(
        "trainjob.dev", "v1alpha1", namespace, "trainjobs", JOB, patch
    )
    cluster.wait_phase(namespace, "Suspended", timeout=300)
    wait_for("every pod gone", lambda: not cluster.pods(namespace), timeout=300)

    patch = {"spec": {"suspend": False}}
    cluster.custom.patch_namespaced_custom_object(
        "trainjob.dev", "v1alpha1", namespace, "trainjobs", JOB, patch
    )
    # `trainjob logs -f` of the driver, from before the new driver's pod exists (it waits for
    # it) to the driver's end, while the job runs to its end.
    follow = subprocess.Popen(
        _cli_args(cluster, [TRAINJOB_CLI, "logs", "-f", JOB], namespace),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_cli_env(),
    )
    try:
        status = cluster.wait_phase(namespace, "Succeeded", timeout=900)
        followed, follow_errors = follow.communicate(timeout=120)
    finally:
        follow.kill()
    assert status["progress"]["step"] == epochs - 1
    assert status["latestCheckpoint"]["step"] == epochs - 1
    # The new driver resumed from a checkpoint in storage rather than from scratch.
    driver_log = cluster.node.kubectl("logs", "-n", namespace, f"{JOB}-driver").stdout
    assert "Resuming run" in driver_log, driver_log[-3000:]
    # One restart (suspending is not one), not counted; the driver's exit 3 named.
    [restart] = status["restartHistory"]
    assert restart["counted"] is False, restart
    assert "exit code 3" in restart["message"] and "preempted" in restart["message"], restart
    assert status["ignoredRestarts"] == 1
    described = cluster.node.kubectl("describe", "tj", "-n", namespace, JOB).stdout
    assert "Restart History:" in described, described
    assert "exit code 3" in described, described
    assert re.search(r"Counted:\s+false", described), described
    # logs -f ended on its own when the driver did, with the driver's whole log.
    assert follow.returncode == 0, (follow.returncode, follow_errors, followed[-3000:])
    assert "Resuming run" in followed, followed[-3000:]
    last_line = driver_log.rstrip().splitlines()[-1]
    assert followed.rstrip().splitlines()[-1] == last_line, (followed[-3000:], last_line)

    # trainjob submit --follow showed the progress to the end and exited as the job did.
    try:
        assert submitted.wait(timeout=120) == 0, submit_out.read_text()[-3000:]
    finally:
        submitted.kill()
    shown = submit_out.read_text()
    shutil.rmtree(scratch, ignore_errors=True)
    assert f"created in namespace {namespace}" in shown, shown[-3000:]
    assert re.search(r"checkpoint_\d+ committed \(step \d+", shown), shown[-3000:]
    assert f"] Succeeded: step {epochs - 1}," in shown, shown[-3000:]

    # kubectl's plugin convention: kubectl runs kubectl-trainjob with the rest of the line.
    logs = _cli(cluster, [str(cluster.node.kubectl_bin), "trainjob", "logs", JOB], namespace)
    assert "Resuming run" in logs.stdout, logs.stdout[-3000:]
    assert driver_log.rstrip().splitlines()[-1] in logs.stdout, logs.stdout[-3000:]

    # The checkpoints committed in storage (their markers), as the SDK and the CLI list them.
    objects = [b.name for b in cluster.gcs().bucket(bucket).list_blobs(prefix=f"runs/{JOB}/")]
    committed = sorted(o.split("/")[2] for o in objects if o.endswith(f"/{COMMIT_MARKER}"))
    latest = status["latestCheckpoint"]["path"]
    assert committed and latest.endswith(f"/{committed[-1]}"), (committed, latest)
    result = client.result(JOB)
    assert sorted(r.name for r in result.checkpoints) == committed, result.checkpoints
    assert result.checkpoint is not None and result.checkpoint.path == latest, result
    listing = _cli(cluster, [TRAINJOB_CLI, "checkpoints", JOB], namespace).stdout
    assert f"Run folder: gs://{bucket}/runs/{JOB}" in listing, listing
    for name in committed:
        assert re.search(rf"^{name}\s", listing, re.MULTILINE), listing
    assert f"Latest: {latest} " in listing, listing


def _follow_driver_log(cluster: Cluster, namespace: str) -> subprocess.Popen[str]:
    """``kubectl logs -f`` of the driver's container: its whole log, up to its exit."""
    return subprocess.Popen(
        [
            str(cluster.node.kubectl_bin),
            f"--kubeconfig={cluster.node.kubeconfig}",
            *("logs", "-f", "-n", namespace, f"{JOB}-driver"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@scenario
def worker_terminated_then_killed_then_driver_head_and_every_pod_deleted_resume_from_checkpoints(
    scene: Scene,
) -> None:
    """Five faults in one run, with the default ``maxRestarts: 0`` (issue 39). A worker pod
    terminated gracefully: its SIGTERM drains its Ray node; the quickstart sees
    get_preemption_info() and commits a last checkpoint; the driver's fit() restarts the
    worker group from it (``failure.maxPreemptionFailures`` -1, Ray Train's default) once the
    operator recreated the pod: no whole-job restart, not a worker failure. Then a worker's
    Ray node killed: the worker group restarts from the latest checkpoint (``maxFailures``).
    Then the driver pod deleted (``kubectl delete pod``, as a drain or an eviction deletes
    it): its SIGTERM makes the run commit what it can and the driver exit 3, and the
    operator restarts the job from the latest checkpoint on a new cluster, not counted
    (``DriverDisrupted``). Then, on that attempt, the Ray head pod deleted: the same
    (``HeadDisrupted``). Then, on the next, every pod of the job deleted at once: one restart,
    not counted. The job succeeds, every checkpoint in
    storage is whole, and ``restartHistory`` names each whole-job restart's cause (and only
    those three). Before, each deletion failed the job (``maxRestarts=0 exhausted``)."""
    cluster, namespace = scene
    epochs = 12
    # Small batches make epochs of seconds, so that the faults land mid-training.
    body = make_job(
        cluster,
        namespace,
        {"epochs": epochs, "batch_size": 8, **GRACEFUL_TERMINATION["config"]},
        failure={"maxFailures": 3},
        podTemplate=GRACEFUL_TERMINATION["podTemplate"],
    )
    wait_for_a_committed_checkpoint(cluster, namespace)
    worker = f"{JOB}-w1"

    def current_driver_log() -> str:
        return cluster.node.kubectl("logs", "-n", namespace, f"{JOB}-driver", check=False).stdout

    def driver_log_once_restarted(attempt: int) -> str | None:
        text = current_driver_log()
        return text if f"(attempt {attempt}), resuming from" in text else None

    terminated_uid = terminate_a_worker_pod_gracefully(cluster, namespace)
    log = wait_for(
        "the worker group restarted in place from its last checkpoint",
        lambda: driver_log_once_restarted(1),
        timeout=600,
        every=2.0,
    )
    # One rank was on the deleted pod; which one depends on Ray's rank order, not pod names.
    one_rank_preempted = r"Preemption of ranks \[[01]\] \(Ray nodes \w+\)"
    assert re.search(one_rank_preempted, log), log[-3000:]
    assert "Worker group failed" not in log, log[-3000:]
    status = cluster.status(namespace)
    assert status.get("restarts", 0) == 0 and not status.get("restartHistory"), status
    # The operator recreated the pod under the same name; the new group runs on it.
    old_uid = cluster.pods(namespace)[worker].metadata.uid
    assert str(old_uid) != terminated_uid

    kill_in_container(cluster, namespace, worker, "raylet")  # the worker's Ray node dies
    wait_for(
        "the worker group restarted from a checkpoint",
        lambda: driver_log_once_restarted(2),
        timeout=600,
        every=2.0,
    )
    # The worker group restarted, not the cluster (the driver publishes its count).
    status = wait_for(
        "the worker failure published",
        lambda: (s := cluster.status(namespace)).get("workerFailures", 0) >= 1 and s,
        timeout=60,
        every=1.0,
    )
    assert status.get("restarts", 0) == 0
    # The killed worker's container ended with the raylet; the operator replaced the pod.
    assert cluster.pods(namespace)[worker].metadata.uid != old_uid

    follow = _follow_driver_log(cluster, namespace)
    cluster.node.kubectl("delete", "pod", "-n", namespace, f"{JOB}-driver", "--wait=false")
    driver_log, _ = follow.communicate(timeout=120)
    assert "restarting (failure 1 of 3)" in driver_log, driver_log[-3000:]
    assert "Termination notice to the driver" in driver_log, driver_log[-3000:]
    assert f"TrainJob {JOB} preempted" in driver_log, driver_log[-3000:]

    def next_attempt_running_with_a_checkpoint(restarts: int) -> None:
        before = (cluster.status(namespace).get("latestCheckpoint") or {}).get("path")
        wait_for(
            f"attempt {restarts} Running with a checkpoint of its own",
            lambda: (
                (s := cluster.status(namespace)).get("restarts") == restarts
                and s.get("phase") == "Running"
                and (s.get("latestCheckpoint") or {}).get("path") != before
            ),
            timeout=600,
            every=1.0,
        )

    next_attempt_running_with_a_checkpoint(1)
    cluster.node.kubectl("delete", "pod", "-n", namespace, f"{JOB}-head", "--wait=false")
    next_attempt_running_with_a_checkpoint(2)
    # Every pod of the job deleted at once (a node pool drained, a namespace's pods evicted):
    # one restart, a disruption of the head or the driver (whichever deletion the operator
    # saw first: kubectl deletes them one by one).
    cluster.node.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=false")

    status = cluster.wait_phase(namespace, "Succeeded", timeout=900)
    assert status["progress"]["step"] == epochs - 1
    assert status["latestCheckpoint"]["step"] == epochs - 1
    assert status["restarts"] == 3 and status["ignoredRestarts"] == 3, status
    driver, head, every_pod = status["restartHistory"]
    assert (driver["reason"], driver["counted"]) == ("DriverDisrupted", False), driver
    assert f"pod {JOB}-driver" in driver["message"], driver
    assert (head["reason"], head["counted"]) == ("HeadDisrupted", False), head
    assert f"pod {JOB}-head" in head["message"], head
    assert every_pod["reason"] in ("HeadDisrupted", "DriverDisrupted"), every_pod
    assert every_pod["counted"] is False, every_pod
    events = cluster.node.kubectl("get", "events", "-n", namespace).stdout
    assert "DriverDisrupted" in events and "HeadDisrupted" in events, events[-3000:]
    # Every checkpoint in storage is whole (listed with its marker, files verified by
    # Result.from_path), none half-written by a driver or head that went away.
    folders, committed = checkpoint_folders(cluster, body["bucket"])
    assert folders == committed, (folders, committed)
    result = TrainJobClient(namespace=namespace, kubeconfig=cluster.node.kubeconfig).result(JOB)
    assert {r.name for r in result.checkpoints} == committed, result.checkpoints


@scenario
def elastic_job_goes_on_with_one_worker_when_one_is_lost_then_grows_back(scene: Scene) -> None:
    """Elastic training in a TrainJob (issue 38): ``numWorkers: 2, minWorkers: 1``. A worker
    pod terminated gracefully: its rank commits a last checkpoint and the worker group
    restarts at once with the one worker left (``progress.workers`` 1) instead of waiting for
    the operator's replacement pod; once that pod's Ray node joined, the next resize check
    (``elasticResizeIntervalSeconds: 5``) grows the group back to 2 from the latest
    checkpoint. No whole-job restart, no worker failure counted; the job succeeds with every
    checkpoint whole."""
    cluster, namespace = scene
    epochs = 10
    body = make_job(
        cluster,
        namespace,
        {"epochs": epochs, "batch_size": 8, **GRACEFUL_TERMINATION["config"]},
        scaling={
            "numWorkers": 2,
            "minWorkers": 1,
            "elasticResizeIntervalSeconds": 5,
            "resourcesPerWorker": {"cpu": POD_CPU},
        },
        podTemplate=GRACEFUL_TERMINATION["podTemplate"],
    )
    wait_for_a_committed_checkpoint(cluster, namespace)

    def group_size(size: int) -> Any:
        status = cluster.status(namespace)
        assert status.get("phase") != "Succeeded", "the job ended before the resize was seen"
        return (status.get("progress") or {}).get("workers") == size and status

    wait_for("a group of 2 workers", lambda: group_size(2), timeout=300, every=0.5)
    terminate_a_worker_pod_gracefully(cluster, namespace)
    wait_for("the group going on with 1 worker", lambda: group_size(1), timeout=300, every=0.5)
    status = wait_for("the group grown back to 2", lambda: group_size(2), timeout=600, every=0.5)
    assert status["phase"] == "Running" and status.get("restarts", 0) == 0, status

    status = cluster.wait_phase(namespace, "Succeeded", timeout=900)
    assert status["progress"]["step"] == epochs - 1 and status["progress"]["workers"] == 2
    assert status.get("restarts", 0) == 0 and not status.get("restartHistory"), status
    assert status.get("workerFailures", 0) == 0, status  # a preemption and a resize: no failure
    log = cluster.node.kubectl("logs", "-n", namespace, f"{JOB}-driver").stdout
    sizes = [int(n) for n in re.findall(r"Started (\d+) workers \(attempt", log)]
    # 2 workers (the first group may have started with the one node that had joined, as Ray
    # Train's does), then 1 after the loss, then 2 again.
    after_two = sizes[sizes.index(2) + 1 :] if 2 in sizes else []
    assert 1 in after_two, (sizes, log[-3000:])
    assert 2 in after_two[after_two.index(1) + 1 :], (sizes, log[-3000:])
    folders, committed = checkpoint_folders(cluster, body["bucket"])
    assert folders == committed, (folders, committed)


@scenario
def jax_example_trains_to_success_in_the_jax_image(scene: Scene) -> None:
    """examples/jax.yaml as it is, but in the examples image built on the Dockerfile's JAX
    variant (``--build-arg JAX=cpu``), sized for this node and storing in fake-gcs-server: two
    JAX processes on CPU (``jax.distributed``, coordinator on rank 0) in two worker pods."""
    cluster, namespace = scene
    node_jax_image = cluster.images[JAX_IMAGE]
    name = JAX_EXAMPLE["metadata"]["name"]
    bucket = f"real-{uuid.uuid4().hex[:8]}"
    cluster.gcs().create_bucket(bucket)
    body = copy.deepcopy(JAX_EXAMPLE)
    body["metadata"] = {"name": name, "namespace": namespace}
    s = body["spec"]
    assert s["framework"] == "jax" and s["scaling"]["numWorkers"] == 2
    s["image"] = node_jax_image.name
    s["scaling"]["resourcesPerWorker"] = {"cpu": POD_CPU}
    s["ray"] = {"head": {"resources": {"cpu": POD_CPU}}}
    s["storage"] = {"path": f"gs://{bucket}/runs"}
    s["env"] = [{"name": "STORAGE_EMULATOR_HOST", "value": f"http://{GCS_HOST}:{GCS_PORT}"}]
    cluster.custom.create_namespaced_custom_object(
        "trainjob.dev", "v1alpha1", namespace, "trainjobs", body
    )
    status = cluster.wait_phase(namespace, "Running", timeout=600, name=name)
    assert status["workers"]["desired"] == 2
    status = cluster.wait_phase(namespace, "Succeeded", timeout=900, name=name)

    steps = int(s["config"]["steps"])
    every = 10  # the example's checkpoint_every
    assert status["progress"]["step"] == steps - 1
    # Every process reported; jax.process_count() was 2 in each (one process per worker pod).
    assert status["progress"]["metrics"]["processes"] == 2, status["progress"]
    latest = status["latestCheckpoint"]
    assert latest["path"] == f"gs://{bucket}/runs/{name}/checkpoint_{steps - 1:06d}", latest
    assert latest["step"] == steps - 1
    assert latest["metrics"]["processes"] == 2, latest
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Succeeded"]["status"] == "True", conditions
    assert status["restarts"] == 0
    pods = {p.metadata.name: p for p in cluster.core.list_namespaced_pod(namespace).items}
    for pod in pods.values():
        assert pod.spec.containers[0].image == node_jax_image.name, pod.metadata.name

    # Committed checkpoints in storage: numToKeep (2) of them, each with its marker, the arrays
    # and meta.json of examples/jax_quickstart, and both in the manifest.
    gcs_bucket = cluster.gcs().bucket(bucket)
    objects = sorted(b.name for b in gcs_bucket.list_blobs(prefix=f"runs/{name}/"))
    manifest = gcs_bucket.blob(f"runs/{name}/checkpoint_manifest.json").download_as_text()
    kept = [f"checkpoint_{step:06d}" for step in (steps - 1 - every, steps - 1)]
    for checkpoint in kept:
        folder = f"runs/{name}/{checkpoint}"
        for file in (COMMIT_MARKER, "meta.json", "params/w1.npy", "m/w1.npy", "v/b2.npy"):
            assert f"{folder}/{file}" in objects, objects
        assert checkpoint in manifest, manifest
    meta = json.loads(gcs_bucket.blob(f"runs/{name}/{kept[-1]}/meta.json").download_as_text())
    assert meta == {"step": steps - 1}
    committed = {o.split("/")[2] for o in objects if o.endswith(f"/{COMMIT_MARKER}")}
    assert committed == set(kept), objects  # the older ones were evicted

    # kubectl's printer columns are filled (no scoreAttribute: no best checkpoint).
    table = cluster.node.kubectl("get", "tj", name, "-n", namespace).stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    assert header[:5] == ["NAME", "PHASE", "WORKERS", "STEP", "BEST"], table
    assert row[0] == name and row[1] == "Succeeded" and row[3] == str(steps - 1), table


def _scrape_the_driver_and_the_operator(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    """A real Prometheus on this machine scrapes the training driver's pod (its ``metrics``
    port, by pod IP, through :meth:`Node.forward`) and the operator's pods while the job
    trains, and answers the chart's alerts and dashboard panels (the names match what the
    containers export). Called right after the TrainJob is created: scraping starts once the
    driver's pod has an IP. Returns the job's status as first seen ``Running`` (None if it
    never was while this waited). Without Debian's prometheus package it only waits for
    that."""
    from tests.chart.test_monitoring import alert_exprs, rule_groups
    from tests.support.prometheus import PROMETHEUS, PrometheusServer, dashboard_queries

    seen_running: list[dict[str, Any]] = []

    def finished_or_note_running() -> bool:
        status = cluster.status(namespace)
        if status.get("phase") == "Running" and not seen_running:
            seen_running.append(status)
        return status.get("phase") in ("Failed", "Succeeded")

    if PROMETHEUS is None:
        wait_for("Running", lambda: finished_or_note_running() or seen_running, timeout=600)
        return seen_running[0] if seen_running else None
    driver_ip = wait_for(
        "the driver pod's IP",
        lambda: (pod := cluster.pods(namespace).get(f"{JOB}-driver")) and pod.status.pod_ip,
        timeout=300,
    )
    operators = cluster.core.list_namespaced_pod(
        OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/name=trainjob-operator"
    ).items
    node = cluster.node
    targets = {
        "driver": [f"127.0.0.1:{node.forward(driver_ip, 9091)}"],
        "operator": [
            f"127.0.0.1:{node.forward(p.status.pod_ip, 9090)}" for p in operators if p.status.pod_ip
        ],
    }
    server = PrometheusServer(Path(tempfile.mkdtemp(prefix="prometheus-")), targets)
    try:
        committed = 'trainjob_train_checkpoints_committed_total{job="driver"}'

        def a_commit_scraped() -> bool:
            if finished_or_note_running():
                return True  # the checks below say what was missed
            return bool(server.query(f"{committed} >= 1"))

        wait_for("a committed checkpoint scraped from the driver", a_commit_scraped, timeout=900)
        # The driver's series as of its last scrape (they go stale once the driver exits).
        at = server.last_sample(committed)
        assert at is not None, "Prometheus never scraped the driver's metrics"
        assert server.query(f"{committed} >= 1", at=at)
        for expr in alert_exprs(rule_groups()).values():
            server.query(expr, at=at)  # answered (a query error raises)
        for title, expr in dashboard_queries("trainjob-training.json"):
            assert server.query(expr, at=at), f"panel {title!r}: no series for {expr}"
        # The operator's series as of its latest scrape, waited for: under load one scrape
        # can pass its 1 s timeout, and the target's series are stale until the next.
        for title, expr in dashboard_queries("trainjob-operator.json"):
            wait_for(
                f"panel {title!r}: a series for {expr}",
                lambda expr=expr: server.query(expr),  # type: ignore[misc]
                timeout=60,
            )
    finally:
        server.stop()
    return seen_running[0] if seen_running else None


@scenario
def quickstart_trains_to_success_in_containers(scene: Scene) -> None:
    cluster, namespace = scene
    epochs = 2
    # Validation scores with Ray Data (map_batches): its tasks must run on the pool's nodes.
    job, bucket = job_manifest(cluster, namespace, {"epochs": epochs}, validation=True)
    job["spec"]["validation"].update(RAY_DATA_VALIDATION)
    # The workers read their batches from Ray Data (spec.data: the datasets built on the
    # driver, their map_batches on the data pool's pod, streamed to the workers).
    job["spec"]["entrypoint"] = "examples.quickstart.train:train_func_on_datasets"
    job["spec"]["data"] = {
        "datasets": "examples.quickstart.train:build_datasets",
        "pool": {"replicas": 1, "resources": {"cpu": POD_CPU}},
    }
    # The datasets' rows (ray.data.from_items) live in the driver node's object store, and
    # Ray Data's split coordinator runs there: the chart default here (512Mi) is too small.
    job["spec"]["ray"]["driver"] = {"resources": DATA_DRIVER_RESOURCES}
    cluster.custom.create_namespaced_custom_object(
        "trainjob.dev", "v1alpha1", namespace, "trainjobs", job
    )
    job["bucket"] = bucket
    # Prometheus scrapes the driver from its pod's start: waiting for Running first left only
    # the few seconds of training to start Prometheus and scrape a commit in, under load.
    running = _scrape_the_driver_and_the_operator(cluster, namespace)
    assert running is not None, "the job finished before it was seen Running"
    assert running["workers"]["desired"] == 2, running
    status = cluster.wait_phase(namespace, "Succeeded", timeout=900)

    assert status["progress"]["step"] == epochs - 1
    latest = status["latestCheckpoint"]
    prefix = f"gs://{job['bucket']}/runs/{JOB}/checkpoint_"
    assert latest["path"] == f"{prefix}{epochs - 1:06d}"
    best = status["bestCheckpoint"]
    assert best["score"] == best["metrics"]["val_loss"]
    # Every Ray Data task of the validations ran on a validation pool node, none on a
    # training worker's (the pool advertises its CPUs; the workers select their own nodes).
    metrics = best["metrics"]
    assert metrics["data_nodes"], metrics
    assert set(metrics["data_nodes"]) <= set(metrics["validation_nodes"]), metrics
    # Every row rank 0 trained on was prepared (map_batches) on the data pool's node: not on
    # a worker's, the head's or the validation pool's.
    assert len(metrics["data_pool_nodes"]) == 1, metrics
    assert set(metrics["ingest_nodes"]) == set(metrics["data_pool_nodes"]), metrics
    assert not set(metrics["data_pool_nodes"]) & set(metrics["validation_nodes"]), metrics
    # Validation ran on the pool scaled up from 0 (every checkpoint validated).
    assert status["validations"]["done"] == epochs
    assert status["validations"]["failed"] == 0
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Succeeded"]["status"] == "True"
    assert status["restarts"] == 0

    # Checkpoints committed in storage: the files, the marker, the manifest.
    bucket = cluster.gcs().bucket(job["bucket"])
    objects = sorted(b.name for b in bucket.list_blobs(prefix=f"runs/{JOB}/"))
    manifest = bucket.blob(f"runs/{JOB}/checkpoint_manifest.json").download_as_text()
    for epoch in range(epochs):
        name = f"checkpoint_{epoch:06d}"
        assert f"runs/{JOB}/{name}/state.pt" in objects, objects
        assert f"runs/{JOB}/{name}/{COMMIT_MARKER}" in objects, objects
        assert name in manifest

    # kubectl's printer columns are filled.
    table = cluster.node.kubectl("get", "tj", JOB, "-n", namespace).stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    assert header[:5] == ["NAME", "PHASE", "WORKERS", "STEP", "BEST"], table
    assert row[0] == JOB and row[1] == "Succeeded" and row[3] == str(epochs - 1), table
    assert row[4].startswith("checkpoint_") or row[4] != "<none>", table

    # The driver pod got its spec.ray.driver.resources (not the chart's default).
    [driver] = cluster.pods(namespace)[f"{JOB}-driver"].spec.containers
    assert driver.resources.requests == DATA_DRIVER_RESOURCES, driver.resources
    # The driver ran DDP over gloo in its own container; the pool and workers were real pods.
    driver_log = cluster.node.kubectl("logs", "-n", namespace, f"{JOB}-driver").stdout
    assert "gloo" in driver_log, driver_log[-3000:]
    # Both worker actors ran in the processes their pods' raylets prestarted (with torch
    # imported) rather than in new ones (trainjob_operator.render.ray.worker_prestart_env).
    assert "2 in Ray worker processes started before" in driver_log, driver_log[-3000:]


@scenario
def an_image_that_cannot_be_pulled_fails_at_the_startup_deadline_saying_why(scene: Scene) -> None:
    """No registry serves this image: the kubelet reports ErrImagePull/ImagePullBackOff, the
    job stays Starting, and startupDeadlineSeconds fails it with the kubelet's reason."""
    cluster, namespace = scene
    make_job(
        cluster,
        namespace,
        {"epochs": 1},
        image="localhost/trainjob-no-such-image:never",
        failure={"startupDeadlineSeconds": 60},
        # Small enough to be placed while earlier tests' pods are still shutting down.
        scaling={"numWorkers": 1, "resourcesPerWorker": {"cpu": "10m"}},
    )
    status = cluster.wait_phase(namespace, "Failed", timeout=600)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Failed"]["reason"] == "StartupDeadlineExceeded", conditions
    message = conditions["Failed"]["message"]
    assert "ErrImagePull" in message or "ImagePullBackOff" in message, message
    assert "trainjob-no-such-image" in message, message
    assert status["restarts"] == 0


@scenario
def deleting_the_trainjob_removes_every_child(scene: Scene) -> None:
    cluster, namespace = scene
    make_job(cluster, namespace, {"epochs": 100})
    cluster.wait_phase(namespace, "Running", timeout=600)
    selector = f"trainjob.dev/name={JOB}"
    kinds = "pods,services,serviceaccounts,roles,rolebindings,secrets,networkpolicies"
    before = cluster.node.kubectl("get", kinds, "-n", namespace, "-l", selector, "-o", "name")
    assert f"pod/{JOB}-head" in before.stdout, before.stdout
    # The driver pod got the chart's defaults.driver.resources.
    [driver] = cluster.pods(namespace)[f"{JOB}-driver"].spec.containers
    assert driver.resources.requests == DRIVER_RESOURCES, driver.resources

    cluster.node.kubectl("delete", "tj", JOB, "-n", namespace, "--timeout=300s", timeout=320)

    def nothing_left() -> bool:
        left = cluster.node.kubectl("get", kinds, "-n", namespace, "-l", selector, "-o", "name")
        return left.stdout.strip() == ""

    wait_for("every child of the TrainJob deleted", nothing_left, timeout=300)


@scenario
def entrypoint_that_does_not_import_fails_with_invalid_input(scene: Scene) -> None:
    cluster, namespace = scene
    make_job(cluster, namespace, {"epochs": 1}, entrypoint="examples.quickstart.missing:train_func")
    status = cluster.wait_phase(namespace, "Failed", timeout=900)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Failed"]["status"] == "True"
    assert conditions["Failed"]["reason"] == "InvalidInput", conditions
    assert "examples.quickstart.missing" in status["message"], status["message"]
    assert status["restarts"] == 0


JAX_SCENARIO = jax_example_trains_to_success_in_the_jax_image.__name__


@pytest.mark.parametrize("name", SCENARIOS.names(exclude=[JAX_SCENARIO]))
def test_scenario(scenarios: RunningScenarios, name: str) -> None:
    scenarios.check(name)


@pytest.mark.scenario(JAX_SCENARIO)
def test_jax_scenario(scenarios: RunningScenarios, node_jax_image: Image) -> None:
    """Asks for :func:`node_jax_image`, so that the session builds and imports the JAX image."""
    scenarios.check(JAX_SCENARIO)
