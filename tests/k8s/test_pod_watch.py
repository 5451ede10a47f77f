"""The operator's pod watch (``trainjob_operator.pod_watch``): how it reads watch lines, and
the watch itself against a real kube-apiserver (changes, deletions, an expired version)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from tests.support import EnvTest
from trainjob_operator.constants import MANAGED_BY_LABEL, NAME_LABEL
from trainjob_operator.kube import KubeClient, KubeConfig
from trainjob_operator.pod_watch import (
    namespace_matcher,
    pod_watches,
    read_watch_line,
    watch_scopes,
)

MANAGED = f"{MANAGED_BY_LABEL}=trainjob-operator"


def _line(event_type: str, obj: dict[str, Any]) -> bytes:
    """A watch line as the API server writes it (compact JSON, ``type`` first)."""
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode()


def _pod(namespace: str, rv: str, job: str | None = "tj") -> dict[str, Any]:
    labels = {MANAGED_BY_LABEL: "trainjob-operator"}
    if job is not None:
        labels[NAME_LABEL] = job
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "tj-worker-0",
            "namespace": namespace,
            "uid": "u-1",
            "resourceVersion": rv,
            "labels": labels,
            "annotations": {"note": '"resourceVersion":"999"'},
            "managedFields": [{"resourceVersion": "998"}],
        },
        "status": {"phase": "Pending"},
    }


def test_an_added_pod_asks_for_nothing_and_its_line_is_not_parsed() -> None:
    added = read_watch_line(_line("ADDED", _pod("ns", "41")))
    assert (added.type, added.resource_version, added.trainjob) == ("ADDED", "41", None)
    # Not parsed: only the version is read off the bytes (the rest may be anything).
    cut = read_watch_line(b'{"type":"ADDED","object":{"metadata":{"resourceVersion":"7","x":')
    assert (cut.type, cut.resource_version) == ("ADDED", "7")
    # Another layout (a proxy that re-indents) is parsed, with the same outcome.
    spaced = json.dumps({"type": "ADDED", "object": _pod("ns", "42")}, indent=1).encode()
    assert read_watch_line(spaced) == added.__class__("ADDED", "42", None)


def test_a_changed_or_deleted_pod_asks_for_its_trainjob() -> None:
    changed = read_watch_line(_line("MODIFIED", _pod("team-a", "50")))
    assert (changed.resource_version, changed.trainjob) == ("50", ("team-a", "tj"))
    deleted = read_watch_line(_line("DELETED", _pod("team-a", "51")))
    assert deleted.trainjob == ("team-a", "tj")
    unlabelled = read_watch_line(_line("MODIFIED", _pod("team-a", "52", job=None)))
    assert (unlabelled.resource_version, unlabelled.trainjob) == ("52", None)


def test_bookmarks_move_the_version_and_errors_carry_their_status() -> None:
    bookmark = read_watch_line(
        _line("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "77"}})
    )
    assert (bookmark.type, bookmark.resource_version, bookmark.trainjob) == ("BOOKMARK", "77", None)
    gone = read_watch_line(_line("ERROR", {"kind": "Status", "code": 410, "message": "too old"}))
    assert gone.type == "ERROR" and gone.error == {
        "kind": "Status",
        "code": 410,
        "message": "too old",
    }


def test_watch_scopes_and_namespace_matching() -> None:
    assert watch_scopes(None) == [None] and watch_scopes([]) == [None]
    assert watch_scopes(["a", "b", "a"]) == ["a", "b"]
    assert watch_scopes(["a", "team-*"]) == [None]  # a pattern: one watch, filtered here
    matches = namespace_matcher(["a", "team-*"])
    assert matches("a") and matches("team-x") and not matches("b")
    assert namespace_matcher(None)("anything")


# -- against a real kube-apiserver ------------------------------------------------------------
def _config(envtest: EnvTest) -> KubeConfig:
    return KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))


def _make_pod(kube: KubeClient, namespace: str, name: str, job: str) -> None:
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "watched", "namespace": namespace},
        },
        namespace,
    )
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {MANAGED_BY_LABEL: "trainjob-operator", NAME_LABEL: job},
            },
            "spec": {
                "serviceAccountName": "watched",
                "automountServiceAccountToken": False,
                "containers": [{"name": "main", "image": "busybox"}],
            },
        },
        namespace,
    )


def test_the_watch_reports_changes_and_deletions_of_managed_pods_not_their_creation(
    envtest: EnvTest, kube: KubeClient, k8s_namespace: str
) -> None:
    ns = k8s_namespace
    changes: list[tuple[str, str]] = []
    relists: list[bool] = []

    async def scenario() -> None:
        async with pod_watches(
            _config(envtest),
            [ns],
            MANAGED,
            lambda *c: changes.append(c),
            lambda: relists.append(True),
        ) as watches:
            await asyncio.wait_for(watches[0].listed.wait(), 30)
            await asyncio.to_thread(_make_pod, kube, ns, "p0", "job-a")
            await asyncio.sleep(1.0)
            assert changes == []  # its creation asks for nothing
            await asyncio.to_thread(
                kube.patch, "Pod", ns, "p0", {"status": {"phase": "Failed"}}, "status"
            )
            await _until(lambda: changes == [(ns, "job-a")])
            await asyncio.to_thread(kube.delete, "Pod", ns, "p0")
            await _until(lambda: len(changes) >= 2)
            assert set(changes) == {(ns, "job-a")}
            assert relists == []

    asyncio.run(scenario())


def test_an_expired_version_is_listed_again_and_reported_as_a_gap() -> None:
    """410 Gone, from a stand-in API server (:func:`_stand_in`): kube-apiserver 1.20's watch
    cache replays from any version it is asked for (even "1", after an etcd compaction), so
    the real one here cannot be made to expire a version on demand."""
    requests, changes, relists = _stand_in(
        [{"metadata": {"resourceVersion": "10"}}, {"metadata": {"resourceVersion": "20"}}]
    )
    assert requests == [("LIST", "0"), ("WATCH", "10"), ("LIST", "0"), ("WATCH", "20")]
    assert changes == [("team-a", "job-b")]
    assert relists == [True]  # the first LIST is not a gap; the one after 410 is


def test_a_malformed_answer_is_logged_and_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    # Any failure of the watch's loop is retried: a watch task that died would go unnoticed
    # while pod changes stopped reaching the operator.
    requests, changes, relists = _stand_in(
        [{"kind": "PodList"}, {"metadata": {"resourceVersion": "20"}}]
    )
    assert requests == [("LIST", "0"), ("LIST", "0"), ("WATCH", "20")]
    assert changes == [("team-a", "job-b")] and relists == []
    assert "Pod watch (namespace team-a) failed, again in 1 s: KeyError" in caplog.text


def _stand_in(
    list_answers: list[dict[str, Any]],
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[bool]]:
    """Run the pod watch of namespace ``team-a`` against a stand-in API server until it
    reports a change; returns (requests, changes, relists). LISTs answer ``list_answers`` in
    turn; a WATCH from version 10 answers as the real API server does when a watch fell
    behind (200, then an ``ERROR`` line with code 410), one from 20 a change of a pod of
    TrainJob ``job-b``."""
    requests: list[tuple[str, str]] = []
    changes: list[tuple[str, str]] = []
    relists: list[bool] = []
    answers = iter(list_answers)
    streams_open: list[asyncio.Event] = []  # set at the end: the stand-in's streams close

    async def pods(request: web.Request) -> web.StreamResponse:
        rv = request.query.get("resourceVersion", "")
        watching = request.query.get("watch") == "1"
        requests.append(("WATCH" if watching else "LIST", rv))
        if not watching:
            return web.json_response({"kind": "PodList", **next(answers)})
        response = web.StreamResponse()
        await response.prepare(request)
        if rv == "10":
            gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
            await response.write(_line("ERROR", gone) + b"\n")
            return response
        await response.write(_line("MODIFIED", _pod("team-a", "21", job="job-b")) + b"\n")
        await streams_open[0].wait()
        return response

    async def scenario() -> None:
        streams_open.append(asyncio.Event())
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/team-a/pods", pods)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        config = KubeConfig(host=f"http://127.0.0.1:{port}", token="t")
        try:
            async with pod_watches(
                config, ["team-a"], MANAGED, _append(changes), lambda: relists.append(True)
            ) as watches:
                await _until(lambda: bool(changes))
                assert watches[0].resource_version == "21"
        finally:
            streams_open[0].set()
            await runner.cleanup()

    asyncio.run(scenario())
    return requests, changes, relists


def _append(changes: list[tuple[str, str]]) -> Any:
    return lambda namespace, job: changes.append((namespace, job))


async def _until(check: Any, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.05)
