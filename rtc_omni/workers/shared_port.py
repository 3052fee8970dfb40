"""The HTTP port the workers share: the supervisor binds it first, then each worker binds and listens on it.

Its own module so that the app, which a worker runs, needs nothing of the supervisor."""

from __future__ import annotations

import socket


def bind_shared_port(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port that other processes of this user may bind too (SO_REUSEPORT):
    the kernel spreads new connections over those that listen."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock
