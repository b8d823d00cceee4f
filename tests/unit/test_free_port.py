"""The suite's free ports: never one an outgoing connection may take, never one twice."""

from __future__ import annotations

import random
import socket
from contextlib import closing

import pytest

import support
from support import free_port


def test_a_free_port_lies_outside_the_ephemeral_range_and_is_not_handed_out_twice() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(20000 <= port < 65536 for port in ports)
    assert not any(port in support._EPHEMERAL for port in ports)
    with closing(socket.socket()) as sock:  # and nobody listens there
        sock.bind(("127.0.0.1", ports[-1]))


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with closing(socket.socket()) as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        support._HANDED_OUT.discard(taken)  # as if another process had bound it
        first = lambda ports: ports.sort(key=lambda port: port != taken)  # noqa: E731
        monkeypatch.setattr(random, "shuffle", first)
        assert free_port() != taken


def test_the_xdist_processes_share_the_ports_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    for worker in range(3):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        assert {(free_port() - 20000) % 3 for _ in range(20)} == {worker}
