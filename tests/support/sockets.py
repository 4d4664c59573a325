"""Raw sockets for tests of the connection layer and the balancer's edge limits."""

from __future__ import annotations

import socket

CLOSED_WITHIN_S = 60.0  # a bound for a stuck peer, not a measurement


def until_closed(sock: socket.socket, timeout: float = CLOSED_WITHIN_S) -> bytes:
    """Everything the peer sends on ``sock`` until it closes the connection (EOF or reset)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data
