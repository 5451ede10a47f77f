"""Shared fixtures: a real fake-gcs-server and a real local Ray cluster.

Both are session-scoped: each starts once and is shared by the tests that ask for it.

Every test is marked by what it needs (:func:`pytest_collection_modifyitems`), which is how
``tests/suite.py`` splits the suite into tiers: ``ray`` for a test that uses the session's
Ray cluster, ``k8s`` for one that uses kube-apiserver (``envtest``), ``node`` for the real node;
a test that starts Ray, Kubernetes or a slow process some other way carries its marker itself
(``slow``: a test of more than a few seconds that needs none of them). The ``unit`` tier (and
``make test-quick``) is what is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.gcs import GCSEmulator
from tests.k8s.conftest import session_envtest
from tests.s3 import S3Server
from tests.support import EnvTest
from trainer_runtime.storage.factory import reset_storage_cache

REPO_ROOT = Path(__file__).resolve().parent.parent

# Ray workers import test workloads (tests.runtime.workloads) by module name.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Ray's state API (which ray.train's PlacementGroupCleaner calls in every fit to see whether
# its controller still lives) finds its cluster by RAY_API_SERVER_ADDRESS, else RAY_ADDRESS,
# else the newest Ray cluster of the machine: with tests' clusters side by side, that can be
# another one, whose dashboard answers that the controller does not exist; the cleaner then
# removes the placement group of the fit in progress. With a closed port here, no Ray process
# of a test reaches any cluster's state API: the cleaner only logs that it cannot ask, as it
# does on its own cluster when that runs no dashboard (the test fixtures' clusters).
os.environ.setdefault("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:9")


MARKER_OF_FIXTURE = {
    "ray_cluster": "ray",
    "envtest": "k8s",
    "node_provisioned": "node",
}
"""A test that uses one of these fixtures (directly or through another) gets that marker."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by what it needs, before ``-m`` selects."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, marker in MARKER_OF_FIXTURE.items():
            if fixture in names and item.get_closest_marker(marker) is None:
                item.add_marker(marker)


XDIST_SPREAD_MODULES = frozenset(
    {
        "tests/api/test_malformed_manifests.py",
        "tests/compat/test_differential.py",
        "tests/faults/test_misuse.py",
        "tests/faults/test_preemption_ray_node.py",
        "tests/runtime/test_jax_trainer.py",
        "tests/runtime/test_ray_train_api.py",
        "tests/runtime/test_torch_trainer.py",
        "tests/runtime/test_validation.py",
        "tests/test_cli_run.py",
    }
)
"""Under pytest-xdist (``tests/suite.py``'s ray tier), the tests of these modules go to the
workers one by one: they are long and share nothing but session fixtures. Every other module's
tests stay together on one worker, so that its module-scoped fixtures (a fake TPU cluster, an
operator) start once."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Schedule by module, except the modules of :data:`XDIST_SPREAD_MODULES` (by test).

    xdist's own ``--dist loadgroup`` renames items to group them, which pytest 9 no longer
    allows (a node's id is derived, not stored), so the grouping is the scheduler's."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return nodeid if module in XDIST_SPREAD_MODULES else module

    return ModuleScheduling(config, log)


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GCSEmulator]:
    """Start fake-gcs-server on a free port and point google-cloud-storage at it."""
    emulator = GCSEmulator().start()
    old = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = emulator.url
    reset_storage_cache()
    try:
        yield emulator
    finally:
        emulator.cleanup()
        if old is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = old
        reset_storage_cache()


@pytest.fixture(scope="session")
def envtest() -> Iterator[EnvTest]:
    """One etcd + kube-apiserver (+ kube-controller-manager) for the whole session, shared by
    every folder that uses it (:func:`tests.k8s.conftest.session_envtest`)."""
    yield from session_envtest()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on a free port; pyarrow's S3 client in this process is pointed at it
    (Ray workers get ``s3_server.env`` through ``RunConfig.worker_runtime_env``)."""
    server = S3Server().start()
    old = {key: os.environ.get(key) for key in server.env}
    os.environ.update(server.env)
    reset_storage_cache()
    try:
        yield server
    finally:
        server.stop()
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reset_storage_cache()


@pytest.fixture(scope="session")
def ray_cluster(gcs_emulator: GCSEmulator) -> Iterator[Any]:
    """A real local Ray cluster: a head node with 6 logical CPUs and no validation slots.

    Started after the GCS emulator so that workers inherit STORAGE_EMULATOR_HOST.
    """
    import ray

    ray.init(
        address="local",
        num_cpus=6,
        include_dashboard=False,
        log_to_driver=True,
        configure_logging=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()


@contextmanager
def extra_ray_node(ray: Any, args: list[str], what: str) -> Iterator[str]:
    """A second Ray node (``ray start --address=<the session's head> --block`` + ``args``) in
    its own process group, yielded by node id once it joined; stopped (SIGTERM, then SIGKILL)
    on exit. ``what`` names it in the error when it does not join within 120 s."""
    address = ray.get_runtime_context().gcs_address
    before = {node["NodeID"] for node in ray.nodes()}
    ray_bin = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen(
        [
            str(ray_bin),
            "start",
            f"--address={address}",
            *args,
            "--block",
            "--disable-usage-stats",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    node_id = None
    while node_id is None:
        for node in ray.nodes():
            if node["Alive"] and node["NodeID"] not in before:
                node_id = node["NodeID"]
        if node_id is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the {what} Ray node did not join the cluster")
            time.sleep(0.5)
    try:
        yield node_id
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def ray_validation_node(ray_cluster: Any) -> Iterator[str]:
    """A second Ray node (``ray start``) that alone advertises ``{"validation": 2}``.

    It advertises no CPUs (a validation pool pod advertises its own, for the Ray Data tasks
    of a validation): only what asks for no CPU and ``validation`` slots (or is pinned to it)
    runs there.

    Yields its node id, so tests can check where validation tasks ran.
    """
    with extra_ray_node(
        ray_cluster, ["--num-cpus=0", '--resources={"validation": 2}'], "validation"
    ) as node_id:
        yield node_id


@pytest.fixture
def ray_data_node(ray_cluster: Any) -> Iterator[str]:
    """A data pool pod's Ray node for one test: 2 CPUs and the label ``trainjob.dev/pool=data``
    (as :func:`trainjob_operator.render.data_pool.render_data_pods` starts it). Function
    scoped: its CPUs are not left in the session's cluster for other tests' tasks.

    Yields its node id, so tests can check where the datasets' Ray Data tasks ran.
    """
    with extra_ray_node(
        ray_cluster, ["--num-cpus=2", "--num-gpus=0", "--labels=trainjob.dev/pool=data"], "data"
    ) as node_id:
        yield node_id


@pytest.fixture
def gcs_bucket(gcs_emulator: GCSEmulator) -> str:
    """A fresh, empty bucket on the emulator."""
    return gcs_emulator.new_bucket()


@pytest.fixture(params=["local", "gcs", "s3"])
def storage_path(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A storage root: a local folder, ``gs://<fresh bucket>/runs`` on fake-gcs-server, or
    ``s3://<fresh bucket>/runs`` on moto's S3 server."""
    if request.param == "local":
        return str(tmp_path / "storage")
    if request.param == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        return f"s3://{server.new_bucket()}/runs"
    emulator: GCSEmulator = request.getfixturevalue("gcs_emulator")
    return f"gs://{emulator.new_bucket()}/runs"
