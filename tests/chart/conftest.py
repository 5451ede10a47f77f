"""Chart tests: rendering needs only the Helm SDK; the cluster tests use the real kube-apiserver +
etcd of :mod:`tests.k8s.conftest` (the same fixtures, provisioned the same way, skipped with
``TRAINJOB_SKIP_K8S_TESTS=1``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.k8s import conftest as k8s_conftest
from tests.k8s.conftest import k8s_api, k8s_namespace

__all__ = ["k8s_api", "k8s_namespace"]

_HERE = Path(__file__).resolve().parent


def pytest_collection_finish(session: pytest.Session) -> None:
    """Provision kube-apiserver/etcd (as tests/k8s does) for the cluster tests of this folder."""
    k8s_conftest.provision_before_tests(
        session,
        lambda path: (
            _HERE in path.parents and path.name in ("test_cluster.py", "test_webhook_cluster.py")
        ),
    )
