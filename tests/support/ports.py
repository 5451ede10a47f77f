"""A free TCP port of this machine, for a server a test starts."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port of ``host`` that nothing listens on now (the OS picks it; a server started right
    after binds it, barring a race with another process)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
