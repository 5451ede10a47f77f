"""Fixtures of the cluster tier: :func:`node`, a real single-node Kubernetes cluster on containerd
(:mod:`tests.support.node`) shared by every test marked ``node`` in one session.

Provisioning (the Kubernetes binaries, the node's host side, the images built from the
Dockerfile) happens once, right after collection and before any test runs, with live output
(it takes minutes the first time, longer than a test's timeout), and only when a selected
test is marked ``node``. The JAX runtime image (the Dockerfile's ``JAX=cpu`` variant, with the
examples on top) is built and imported too when a selected test asks for
:func:`node_jax_image`. It needs root on Debian bookworm; elsewhere these tests are skipped.
``TRAINJOB_SKIP_NODE_TESTS=1`` (or ``TRAINJOB_SKIP_K8S_TESTS=1``) skips them.

``test_placement.py`` needs only the Kubernetes binaries (kube-scheduler against an envtest API
server and Node objects without kubelets, :mod:`tests.support.scheduler`): they are provisioned
as for ``tests/k8s`` (:func:`tests.k8s.conftest.provision_before_tests`), on any machine that
can run the envtest tier.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s import conftest as k8s_conftest
from tests.support import EnvTestError, ensure_assets, raise_if_provisioning_failed
from tests.support.concurrent import summary_lines
from tests.support.node import Image, Node, build_images, provision_host, unsupported_reason

SKIP_ENVS = ("TRAINJOB_SKIP_NODE_TESTS", "TRAINJOB_SKIP_K8S_TESTS")
NODE_IMAGES = ("operator", "examples", "fake-gcs")
"""The images the node imports (the examples image holds the runtime image's layers)."""
JAX_IMAGE = "examples-jax"
"""Imported as well when built: the examples on the JAX runtime image (``--jax``)."""
JAX_FIXTURE = "node_jax_image"

_provisioned: tuple[Path, Path, dict[str, Image]] | None = None
_provision_error: str | None = None
_node_timings: dict[str, float] = {}
"""When each phase of the node's start ended (the running node's ``timings``, which the
tests' own set-up may add to), for the summary."""


def _skip_reason() -> str | None:
    for env in SKIP_ENVS:
        if os.environ.get(env) == "1":
            return f"{env}=1"
    return unsupported_reason()


def _wants_jax(items: list[pytest.Item]) -> bool:
    return any(JAX_FIXTURE in getattr(item, "fixturenames", ()) for item in items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Provision the node (binaries, host side, images) when a ``node`` test was selected; the
    JAX images only when a selected test uses :func:`node_jax_image`."""
    global _provisioned, _provision_error
    k8s_conftest.provision_before_tests(session, lambda path: path.name == "test_placement.py")
    if session.config.option.collectonly or _skip_reason() is not None:
        return
    if not any(item.get_closest_marker("node") for item in session.items):
        return
    capman = session.config.pluginmanager.getplugin("capturemanager")
    live = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with live:
        try:
            raise_if_provisioning_failed()
            assets = ensure_assets()
            cache = provision_host()
            images = build_images(jax=_wants_jax(session.items))
            _provisioned = (assets, cache, images)
        except EnvTestError as e:
            _provision_error = str(e)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the item (``item.rep_call``): fixtures dump the cluster's
    state only when the test failed."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Each real-node scenario's own seconds, in order (they run at the same time, so the
    tests' durations show the waits they share, not what each took)."""
    lines = summary_lines()
    if _node_timings:
        phases = ", ".join(f"{name} {seconds:.0f}" for name, seconds in _node_timings.items())
        lines.insert(0, f"node started (seconds from its start): {phases}")
    if lines:
        terminalreporter.section("real-node scenarios")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def node_provisioned() -> tuple[Path, Path, dict[str, Image]]:
    """(Kubernetes binaries, the node's cache folder, the images built from the Dockerfile)."""
    global _provisioned
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    if _provision_error is not None:
        pytest.fail(f"provisioning the node failed:\n{_provision_error}", pytrace=False)
    if _provisioned is None:
        _provisioned = (ensure_assets(), provision_host(), build_images(jax=True))
    return _provisioned


@pytest.fixture(scope="session")
def node_images(node_provisioned: tuple[Path, Path, dict[str, Image]]) -> dict[str, Image]:
    """Key (``operator``, ``runtime``, ``examples``, ``fake-gcs``, and with the JAX build
    ``runtime-jax``, ``examples-jax``) -> the image built."""
    return node_provisioned[2]


@pytest.fixture(scope="session")
def node_jax_image(node_images: dict[str, Image]) -> Image:
    """The examples on the JAX runtime image (the Dockerfile's ``JAX=cpu`` variant), imported
    into the node; asking for it makes the session build it (once, cached like the others)."""
    if JAX_IMAGE not in node_images:
        pytest.fail(f"no {JAX_IMAGE} image: the images were built without --jax", pytrace=False)
    return node_images[JAX_IMAGE]


@pytest.fixture(scope="package")
def node(node_provisioned: tuple[Path, Path, dict[str, Image]]) -> Iterator[Node]:
    """The running node (etcd, control plane, containerd, kubelet, kube-proxy, DNS).

    Package-scoped: it stops after the last test under ``tests/cluster``, so its control plane
    and pods do not take CPU from the tiers that run after it."""
    assets, cache, images = node_provisioned
    keys = [*NODE_IMAGES, *([JAX_IMAGE] if JAX_IMAGE in images else [])]
    with Node(assets, cache, [images[key] for key in keys]) as running:
        global _node_timings
        _node_timings = running.timings
        yield running
