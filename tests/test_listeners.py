"""The listening sockets of several API processes (app/server.py): real sockets on
loopback, no engine. The supervisor's socket holds the port without listening, and
connections spread evenly over the sockets that listen beside it."""

from __future__ import annotations

import socket
from collections import Counter

import pytest

from app.server import bind, listener_beside

CONNECTIONS = 400


def test_connections_spread_evenly_over_the_listeners_beside_the_held_port() -> None:
    held = bind("127.0.0.1", 0, shared=True)
    port = held.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):  # held, not listening: refused, never left waiting
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    listeners = [listener_beside(held) for _ in range(4)]
    for sock in listeners:
        sock.listen(CONNECTIONS)
        sock.setblocking(False)
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(CONNECTIONS)]
    accepted: Counter[int] = Counter()
    for index, sock in enumerate(listeners):
        while True:
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                break
            conn.close()
            accepted[index] += 1
    for sock in (*clients, *listeners, held):
        sock.close()
    assert sum(accepted.values()) == CONNECTIONS
    # Each of 4 gets about 100 (a hash of each connection's address); a shared socket gave 14-41%.
    assert all(accepted[i] >= CONNECTIONS // 8 for i in range(4)), accepted
