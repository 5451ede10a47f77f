"""End-to-end tests: the real kube-apiserver + etcd of :mod:`tests.k8s.conftest` (the same
fixtures, provisioned the same way, skipped with ``TRAINJOB_SKIP_K8S_TESTS=1``), the operator
in-process, fake-gcs-server, and :class:`~trainjob_operator.testing.pod_runner.PodRunner` playing
the kubelet, so the pods' ``ray start`` and driver commands really run here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.k8s import conftest as k8s_conftest
from tests.k8s.conftest import envtest, k8s_api, k8s_namespace

__all__ = ["envtest", "k8s_api", "k8s_namespace"]

_HERE = Path(__file__).resolve().parent


def pytest_collection_finish(session: pytest.Session) -> None:
    """Provision kube-apiserver/etcd before the tests (outside any test's timeout), as
    ``tests/k8s`` does, when a test of this folder was selected."""
    if session.config.option.collectonly or k8s_conftest._skipped():
        return
    if k8s_conftest._provisioned is not None or k8s_conftest._provision_error is not None:
        return  # another folder's hook already did it
    if not any(_HERE in Path(str(item.path)).resolve().parents for item in session.items):
        return
    capman = session.config.pluginmanager.getplugin("capturemanager")
    live = capman.global_and_fixture_disabled() if capman else None
    if live is None:
        _provision()
        return
    with live:
        _provision()


def _provision() -> None:
    try:
        k8s_conftest._provisioned = k8s_conftest.ensure_assets()
    except k8s_conftest.EnvTestError as e:
        k8s_conftest._provision_error = str(e)
