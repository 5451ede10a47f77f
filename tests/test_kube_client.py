"""KubeClient's transport against a local HTTP/1.1 server: kept-alive connections, recovery
when the server drops an idle one, retries of transient answers, errors with the server's
message. (The API-server behaviour is tested in tests/k8s.)"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import os
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from trainjob_operator import kube as kube_module
from trainjob_operator.kube import (
    DRIVER_USER_AGENT,
    OPERATOR_USER_AGENT,
    ApiError,
    KubeClient,
    KubeConfig,
)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.requests: list[tuple[str, str]] = []
        self.authorizations: list[str | None] = []
        self.user_agents: list[str | None] = []
        self.answers: list[int] = []  # statuses to answer next (then 200)
        self.drop_after_answer = False  # close the connection without saying so


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.requests.append((self.command, self.path))
        self.server.authorizations.append(self.headers.get("Authorization"))
        self.server.user_agents.append(self.headers.get("User-Agent"))
        status = self.server.answers.pop(0) if self.server.answers else 200
        body = json.dumps(
            {"kind": "Status", "reason": "Busy", "message": "try later"}
            if status >= 400
            else {"items": [], "path": self.path}
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.server.drop_after_answer:
            self.close_connection = True  # no "Connection: close": the client learns late

    do_GET = do_POST = do_PATCH = do_DELETE = _answer


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _client(server: _Server, **kwargs: Any) -> KubeClient:
    host, port = server.server_address[:2]
    return KubeClient(KubeConfig(host=f"http://{host}:{port}"), **kwargs)


def test_requests_share_one_kept_alive_connection(server: _Server) -> None:
    kube = _client(server)
    for _ in range(5):
        kube.list("Pod", "ns", "app=x", from_cache=True)
    assert server.connections == 1
    assert server.requests[-1] == (
        "GET",
        "/api/v1/namespaces/ns/pods?labelSelector=app%3Dx&resourceVersion=0",
    )
    kube.list("Pod", "ns")
    assert server.requests[-1] == ("GET", "/api/v1/namespaces/ns/pods")


def test_requests_name_their_sender_in_the_user_agent(server: _Server) -> None:
    # The API server names the writer of each field after the User-Agent's product.
    _client(server).list("Pod", "ns")
    _client(server, user_agent=DRIVER_USER_AGENT).list("Pod", "ns")
    assert server.user_agents == [OPERATOR_USER_AGENT, DRIVER_USER_AGENT]
    assert [ua.split("/")[0] for ua in server.user_agents if ua] == [
        "trainjob-operator",
        "trainjob-driver",
    ]
    version = importlib.metadata.version("trainjob-operator")
    assert f"trainjob-operator/{version}" == OPERATOR_USER_AGENT


def test_a_connection_the_server_dropped_is_reopened_without_a_failed_attempt(
    server: _Server,
) -> None:
    kube = _client(server, attempts=1)  # a lost idle connection must not use up the attempt
    server.drop_after_answer = True
    for _ in range(3):
        assert kube.get("Pod", "ns", "p") is not None
    assert server.connections == 3
    assert len(server.requests) == 3  # each request reached the server exactly once


def test_transient_answers_are_retried_then_reported(server: _Server) -> None:
    kube = _client(server, attempts=3)
    server.answers = [503, 429]
    assert kube.get("Pod", "ns", "p") is not None
    assert len(server.requests) == 3
    server.answers = [503, 503, 503]
    with pytest.raises(ApiError, match="HTTP 503 Busy: try later") as info:
        kube.get("Pod", "ns", "p")
    assert info.value.status == 503


def test_an_unreachable_server_is_reported_after_the_attempts() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed
    kube = KubeClient(KubeConfig(host=f"http://127.0.0.1:{port}"), attempts=2)
    with pytest.raises(ApiError, match="Unreachable") as info:
        kube.get("Pod", "ns", "p")
    assert info.value.status == 0


def test_a_bad_server_address_is_refused_with_the_expected_form() -> None:
    with pytest.raises(ValueError, match=r"expected https://HOST\[:PORT\]"):
        KubeClient(KubeConfig(host="apiserver:6443"))


def _rotate(folder: Path, token: str, generation: int) -> None:
    """Swap the token as the kubelet does a projected volume: a new ..data symlink."""
    data = folder / f"..{generation}"
    data.mkdir()
    (data / "token").write_text(token + "\n")
    link = folder / "..data_tmp"
    link.symlink_to(data.name)
    os.replace(link, folder / "..data")
    if not (folder / "token").is_symlink():
        (folder / "token").symlink_to("..data/token")


def test_a_rotated_token_file_is_re_read(server: _Server, tmp_path: Path) -> None:
    _rotate(tmp_path, "first", 1)
    host, port = server.server_address[:2]
    config = KubeConfig(host=f"http://{host}:{port}", token_file=str(tmp_path / "token"))
    kube = KubeClient(config)
    kube.list("Pod", "ns")
    _rotate(tmp_path, "second", 2)
    kube.list("Pod", "ns")
    assert server.authorizations == ["Bearer first", "Bearer second"]
    assert config.token == "second"  # what kopf's login reads


def test_kubeconfig_client_keys_are_private_and_removed(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    encoded = base64.b64encode(b"not really a key").decode()
    kubeconfig.write_text(
        json.dumps(
            {
                "current-context": "c",
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [
                    {
                        "name": "u",
                        "user": {"client-certificate-data": encoded, "client-key-data": encoded},
                    }
                ],
            }
        )
    )
    config = KubeConfig.from_kubeconfig(kubeconfig)
    assert config.client_key is not None
    key = Path(config.client_key)
    assert key.read_bytes() == b"not really a key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    kube_module._remove_private_dirs()  # what runs at exit
    assert not key.exists() and not key.parent.exists()
