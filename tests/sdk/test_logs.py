"""``TrainJobClient.logs`` against a small fake API server (plain HTTP): the pod of the role
and rank, its first container, ``follow`` streamed line by line, and waiting for a pod whose
container has not started."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import trainjob_operator.sdk.client as client_module
from trainjob_operator.kube import KubeClient, KubeConfig
from trainjob_operator.sdk import TrainJobClient, TrainJobNotFound
from trainjob_operator.sdk.errors import ClusterUnreachable


def _pod(name: str, container: str, started: bool) -> dict[str, Any]:
    state = {"running": {}} if started else {"waiting": {"reason": "ContainerCreating"}}
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": container}, {"name": "sidecar"}]},
        "status": {"containerStatuses": [{"name": container, "state": state}]},
    }


class FakeApi:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.driver_lists = 0
        self.lock = threading.Lock()

    def answer(self, path: str, query: dict[str, str]) -> tuple[int, Any]:
        with self.lock:
            self.requests.append((path, query))
        base = "/api/v1/namespaces/ns/pods"
        if path == base:
            role = query["labelSelector"].split("trainjob.dev/role=")[1]
            if role == "worker":
                names = ["j-w1", "j-w10", "j-w0", "j-w2"]
                return 200, {"items": [_pod(n, "ray-worker", True) for n in names]}
            with self.lock:
                self.driver_lists += 1
                started = self.driver_lists > 2
            return 200, {"items": [_pod("j-driver", "driver", started)]}
        if path == base + "/j-w0/log":  # a pod silent for a while between two lines
            return 200, [(0.0, "j-w0 line 0\n"), (0.5, "j-w0 line 1\n")]
        if path.startswith(base + "/") and path.endswith("/log"):
            pod = path.split("/")[-2]
            return 200, "".join(f"{pod} line {i}\n" for i in range(3))
        if path == "/apis/trainjob.dev/v1alpha1/namespaces/ns/trainjobs/j":
            return 200, {
                "apiVersion": "trainjob.dev/v1alpha1",
                "kind": "TrainJob",
                "metadata": {"name": "j", "namespace": "ns"},
                "spec": {"entrypoint": "m:f"},
                "status": {"phase": "Starting"},
            }
        return 404, {"reason": "NotFound", "message": path}


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, TrainJobClient]]:
    fake = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            status, body = fake.answer(url.path, query)
            if isinstance(body, list):  # (seconds to wait, text) chunks, streamed
                self.send_response(status)
                self.end_headers()
                for delay, text in body:
                    time.sleep(delay)
                    self.wfile.write(text.encode())
                    self.wfile.flush()
                return
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kube = KubeClient(KubeConfig(host=f"http://127.0.0.1:{server.server_address[1]}"))
    try:
        yield fake, TrainJobClient(namespace="ns", kube=kube)
    finally:
        server.shutdown()
        server.server_close()


def test_the_rank_is_the_pods_order_and_follow_streams_the_first_container(
    api: tuple[FakeApi, TrainJobClient],
) -> None:
    fake, client = api
    lines = list(client.logs("j", follow=True, role="worker", rank=2))
    assert lines == ["j-w2 line 0", "j-w2 line 1", "j-w2 line 2"]
    path, query = fake.requests[-1]
    assert path == "/api/v1/namespaces/ns/pods/j-w2/log"
    assert query == {"container": "ray-worker", "follow": "true"}
    first, *_ = client.logs("j", role="worker", rank=3, tail_lines=1)
    assert first == "j-w10 line 0"
    assert fake.requests[-1][1] == {"container": "ray-worker", "tailLines": "1"}


def test_a_followed_log_may_be_silent_longer_than_the_read_timeout(
    api: tuple[FakeApi, TrainJobClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over plain http (``kubectl proxy``) as over https: ``follow`` has no read timeout."""
    _, client = api
    monkeypatch.setattr(client_module, "LOG_READ_TIMEOUT_S", 0.2)
    assert list(client.logs("j", follow=True, role="worker", rank=0)) == [
        "j-w0 line 0",
        "j-w0 line 1",
    ]
    with pytest.raises(ClusterUnreachable, match="reading the logs of pod j-w0 stopped"):
        list(client.logs("j", role="worker", rank=0))  # not followed: the timeout holds


def test_a_driver_that_has_not_started_is_refused_or_waited_for(
    api: tuple[FakeApi, TrainJobClient],
) -> None:
    fake, client = api
    with pytest.raises(
        TrainJobNotFound, match=r"no driver pod of rank 0 is running \(phase Starting"
    ):
        list(client.logs("j"))
    lines = list(client.logs("j", follow=True, poll_interval=0.01))
    assert lines == ["j-driver line 0", "j-driver line 1", "j-driver line 2"]
    assert fake.driver_lists == 3
