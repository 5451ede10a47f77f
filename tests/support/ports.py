"""A free TCP port of this machine, for a server a test starts."""

from __future__ import annotations

import socket
import threading

_given: set[int] = set()
_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port of ``host`` that nothing listens on now (the OS picks it; a server started right
    after binds it, barring a race with another process), and that this process has not
    handed out before: the OS can pick a port again once its probe socket is closed, and
    servers given their ports up front (several Ray nodes started at once) would collide."""
    with _lock:
        while True:
            with socket.socket() as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
            if port not in _given:
                _given.add(port)
                return port


def own_ray_port_flags() -> list[str]:
    """``ray start`` flags giving a Ray node ports of its own: several Ray nodes share this
    host (in a cluster each pod has its own network), and Ray's fixed defaults (the dashboard
    agent's) collide, as do free ports two ``ray start`` at the same moment each pick."""
    flags = (
        "node-manager-port",
        "object-manager-port",
        "metrics-export-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
    )
    return [f"--{flag}={free_port()}" for flag in flags]
