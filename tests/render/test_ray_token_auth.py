"""A real Ray head started as the operator renders it (command, ``RAY_AUTH_*`` env, the
token of the rendered Secret) refuses a client without the token and serves one with it."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.render.helpers import UID, container, make_job
from tests.support.ports import free_port
from trainjob_operator.render import render_children

CLIENT = """
import sys, ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
except Exception as exc:
    print("REFUSED", type(exc).__name__, exc)
    sys.exit(3)
print("ANSWER", ray.get(ray.remote(lambda: 41 + 1).remote()))
"""


def _base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "TRAINJOB_"))}
    env["HOME"] = str(home)  # no ~/.ray/auth_token of this machine's user
    return env


@pytest.fixture
def rendered() -> tuple[dict[str, Any], str]:
    children = render_children(make_job(name="auth"), uid=UID)
    [secret] = [c for c in children if c["kind"] == "Secret"]
    [head] = [c for c in children if c["metadata"]["name"] == "auth-head"]
    token = base64.b64decode(secret["data"]["token"]).decode()
    return head, token


@pytest.fixture
def head_address(rendered: tuple[dict[str, Any], str], tmp_path: Path) -> Iterator[str]:
    head, token = rendered
    main = container(head)
    env = _base_env(tmp_path)
    for var in main["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:  # the Secret reference, resolved as the kubelet does
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "auth-ray-auth", "key": "token"}
            env[var["name"]] = token
    assert env["RAY_AUTH_MODE"] == "token"
    gcs = free_port()
    ports = {
        "--port": gcs,
        "--dashboard-port": free_port(),
        "--ray-client-server-port": free_port(),
        "--metrics-export-port": free_port(),
        "--num-cpus": 1,  # the rendered head has none; the client's task needs one
    }
    argv = []
    for arg in main["command"]:
        flag = arg.split("=", 1)[0]
        argv.append(f"{flag}={ports[flag]}" if flag in ports else arg)
    temp = tempfile.mkdtemp(prefix="rayauth", dir="/tmp")  # short: Ray's socket paths
    argv += [f"--temp-dir={temp}", "--min-worker-port=0", "--max-worker-port=0"]
    argv[0] = str(Path(sys.executable).with_name("ray"))
    proc = subprocess.Popen(
        argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    address = f"127.0.0.1:{gcs}"
    try:
        deadline = time.monotonic() + 120
        while True:  # until the GCS accepts connections (what the readiness probe checks)
            try:
                socket.create_connection(("127.0.0.1", gcs), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, "ray start --head exited"
                assert time.monotonic() < deadline, "the Ray head did not start"
                time.sleep(0.5)
        yield address
    finally:
        # SIGTERM to `ray start` alone, which stops what it started in seconds (to its whole
        # process group, the stop hung for 20 s); then whatever is left of the group.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _client(address: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLIENT, address],
        env={**_base_env(home), **env},
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.ray  # a real Ray head started as rendered
def test_the_rendered_head_refuses_clients_without_the_token(
    head_address: str, rendered: tuple[dict[str, Any], str], tmp_path: Path
) -> None:
    _, token = rendered
    # At the same time: a refused client spends ~20 s retrying before it gives up.
    with ThreadPoolExecutor(3) as pool:
        clients = [
            pool.submit(_client, head_address, tmp_path, **env)
            for env in (
                {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token},
                {},
                {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
            )
        ]
        allowed, anonymous, wrong = (client.result() for client in clients)
    for _ in range(2):
        # Under the empty-cache run's load the head's node can register after ray.init
        # stopped waiting for it ("ConnectionError Failed to connect to Ray cluster"): the
        # client with the token tries again; the refusals below are not retried.
        if "ANSWER 42" in allowed.stdout or "Failed to connect" not in allowed.stdout:
            break
        allowed = _client(head_address, tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    assert "ANSWER 42" in allowed.stdout, allowed.stdout + allowed.stderr
    assert anonymous.returncode == 3, anonymous.stdout + anonymous.stderr
    assert "REFUSED" in anonymous.stdout
    assert "InvalidAuthToken" in anonymous.stderr or "Unauthenticated" in anonymous.stderr
    assert wrong.returncode == 3, wrong.stdout + wrong.stderr
    assert "ANSWER" not in wrong.stdout


def test_each_job_gets_its_own_token() -> None:
    def token(uid: str) -> str:
        [secret] = [c for c in render_children(make_job(), uid=uid) if c["kind"] == "Secret"]
        return base64.b64decode(secret["data"]["token"]).decode()

    first, again, other = token(UID), token(UID), token("another-uid")
    assert first == again  # rendering stays deterministic within one operator
    assert first != other
    assert len(first) == 64 and int(first, 16) >= 0
