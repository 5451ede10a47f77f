"""End-to-end tests: the real kube-apiserver + etcd of :mod:`tests.k8s.conftest` (the same
fixtures, provisioned the same way, skipped with ``TRAINJOB_SKIP_K8S_TESTS=1``), the operator
in-process, fake-gcs-server, and :class:`~tests.support.pod_runner.PodRunner` playing
the kubelet, so the pods' ``ray start`` and driver commands really run here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.k8s import conftest as k8s_conftest
from tests.k8s.conftest import envtest, k8s_api, k8s_namespace

__all__ = ["envtest", "k8s_api", "k8s_namespace"]

_HERE = Path(__file__).resolve().parent


def pytest_collection_finish(session: pytest.Session) -> None:
    """Provision kube-apiserver/etcd (as tests/k8s does) for the tests of this folder."""
    k8s_conftest.provision_before_tests(session, lambda path: _HERE in path.parents)
