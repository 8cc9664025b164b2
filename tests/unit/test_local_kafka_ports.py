"""The local broker's port test: a port whose last connections linger in TIME_WAIT is free
(the broker's listener uses SO_REUSEADDR), one that another program listens on is not."""

from __future__ import annotations

import socket

from engine.dev.local_kafka import HOST, _port_is_free


def _time_wait_port() -> int:
    """A port with no listener left, only a closed connection of ours in TIME_WAIT on it."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((HOST, 0))
    server.listen(1)
    port = int(server.getsockname()[1])
    client = socket.create_connection((HOST, port))
    accepted, _ = server.accept()
    server.close()
    accepted.close()  # the server side closes first, so its end enters TIME_WAIT
    client.recv(1)
    client.close()
    return port


def test_a_port_in_time_wait_is_free_for_a_new_listener() -> None:
    assert _port_is_free(_time_wait_port())


def test_a_port_with_a_listener_is_busy() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind((HOST, 0))
        other.listen(1)
        assert not _port_is_free(int(other.getsockname()[1]))
