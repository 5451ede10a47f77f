"""Fixtures for tests against a real kube-apiserver + etcd (:mod:`tests.support`).

The binaries are provisioned once, right after collection and before any test runs (building
them takes minutes, longer than the per-test timeout), and only when a test of this folder was
selected. Set ``TRAINJOB_SKIP_K8S_TESTS=1`` to skip these tests instead.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.support import EnvTest, EnvTestError, ensure_assets
from trainjob_operator.kube import KubeClient, KubeConfig

SKIP_ENV = "TRAINJOB_SKIP_K8S_TESTS"
_HERE = Path(__file__).resolve().parent
CRD = _HERE.parents[1] / "crds" / "trainjob.dev_trainjobs.yaml"
_provisioned: Path | None = None
_provision_error: str | None = None


def _skipped() -> bool:
    return os.environ.get(SKIP_ENV) == "1"


def provision_before_tests(session: pytest.Session, needs_cluster: Callable[[Path], bool]) -> None:
    """Provision kube-apiserver/etcd once, outside of any test's timeout and with live output,
    when a selected test file (``needs_cluster(path)``) uses the cluster.

    Every folder whose tests use these fixtures calls this from its own
    ``pytest_collection_finish``; the first one that finds such a test does the work.
    """
    global _provisioned, _provision_error
    if session.config.option.collectonly or _skipped():
        return
    if _provisioned is not None or _provision_error is not None:
        return
    if not any(needs_cluster(Path(str(item.path)).resolve()) for item in session.items):
        return
    capman = session.config.pluginmanager.getplugin("capturemanager")
    live = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with live:
        try:
            _provisioned = ensure_assets()
        except EnvTestError as e:
            _provision_error = str(e)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Provision kube-apiserver/etcd when a test of this folder was selected."""
    provision_before_tests(session, lambda path: _HERE in path.parents)


def session_envtest() -> Iterator[EnvTest]:
    """The session's etcd + kube-apiserver (+ kube-controller-manager): the body of the
    ``envtest`` fixture, which lives in ``tests/conftest.py`` so that every folder using it
    (tests/k8s, tests/chart) shares one (a fixture imported into two conftests is two fixtures,
    and each started its own API server)."""
    if _skipped():
        pytest.skip(f"{SKIP_ENV}=1")
    if _provision_error is not None:
        pytest.fail(f"provisioning kube-apiserver/etcd failed:\n{_provision_error}", pytrace=False)
    assets = _provisioned or ensure_assets()
    with EnvTest(assets) as env:
        yield env


@pytest.fixture(scope="module")
def crd(envtest: EnvTest) -> None:
    """The TrainJob CRD of ``crds/``, applied (again) for the module that asks for it."""
    envtest.apply_crd(CRD)


@pytest.fixture
def kube(envtest: EnvTest) -> KubeClient:
    """The operator's own API client (:class:`trainjob_operator.kube.KubeClient`), as the admin."""
    return KubeClient(
        KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))
    )


@pytest.fixture
def k8s_api(envtest: EnvTest) -> Iterator[client.ApiClient]:
    """An admin ``kubernetes.client.ApiClient``."""
    api = envtest.api_client()
    try:
        yield api
    finally:
        api.close()


def _namespace_name(test_name: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"{base or 'test'}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def k8s_namespace(request: pytest.FixtureRequest, k8s_api: client.ApiClient) -> Iterator[str]:
    """A new namespace named after the test; deleted afterwards."""
    core = client.CoreV1Api(k8s_api)
    name = _namespace_name(request.node.name)
    core.create_namespace(
        client.V1Namespace(
            metadata=client.V1ObjectMeta(name=name, labels={"trainjob.dev/test": "true"})
        )
    )
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)
