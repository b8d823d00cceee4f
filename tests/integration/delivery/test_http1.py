"""The lean HTTP/1.1 client against small real servers: framing, keep-alive, failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from campaign_trigger.delivery.http1 import Http1Pool, finish_request, request_head
from campaign_trigger.delivery.sending import TransportError

Handler = Callable[[bytes], bytes | None]


async def serve(answer: Handler) -> tuple[asyncio.Server, list[bytes], list[int]]:
    """A server that reads each request head+body and writes ``answer(request)`` (None: nothing)."""
    seen: list[bytes] = []
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + await reader.readexactly(length)
                seen.append(request)
                reply = answer(request)
                if reply is not None:
                    writer.write(reply)
                    await writer.drain()
                    if b"Connection: close" in reply:
                        break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen, connections


@pytest.fixture
async def pool_for() -> AsyncIterator[Callable[[asyncio.Server], Http1Pool]]:
    pools: list[Http1Pool] = []

    def make(server: asyncio.Server) -> Http1Pool:
        port = server.sockets[0].getsockname()[1]
        pool = Http1Pool(f"http://127.0.0.1:{port}", timeout_seconds=0.5)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        await pool.aclose()


def request(pool: Http1Pool, body: bytes = b'{"x":1}') -> bytes:
    head = request_head(path="/v1/send", authority=pool.authority, headers="X-A: 1\r\n")
    return finish_request(head, body)


async def test_content_length_answers_reuse_one_connection(
    pool_for: Callable[..., Http1Pool],
) -> None:
    server, seen, connections = await serve(
        lambda _: b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nRetry-After: 3\r\n\r\nok"
    )
    async with server:
        pool = pool_for(server)
        for _ in range(5):
            response = await pool.request(request(pool))
            assert (response.status, response.body) == (200, b"ok")
            assert response.headers[b"retry-after"] == b"3"
    assert len(connections) == 1
    assert seen[0].startswith(b"POST /v1/send HTTP/1.1\r\nHost: 127.0.0.1:")
    assert seen[0].endswith(b'X-A: 1\r\nContent-Length: 7\r\n\r\n{"x":1}')


async def test_chunked_answers_and_connection_close_are_handled(
    pool_for: Callable[..., Http1Pool],
) -> None:
    reply = (
        b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    server, _, connections = await serve(lambda _: reply)
    async with server:
        pool = pool_for(server)
        first = await pool.request(request(pool))
        second = await pool.request(request(pool))
    assert (first.status, first.body) == (503, b"hello world")
    assert second.body == b"hello world"
    assert len(connections) == 2  # the closed connection was not reused


async def test_silent_server_times_out_and_refused_connect_is_a_transport_error(
    pool_for: Callable[..., Http1Pool],
) -> None:
    server, _, _ = await serve(lambda _: None)
    async with server:
        pool = pool_for(server)
        with pytest.raises(TimeoutError):
            await pool.request(request(pool))
    nobody = Http1Pool(f"http://127.0.0.1:{pool.port}", timeout_seconds=0.5)
    with pytest.raises(TransportError):
        await nobody.request(request(nobody))


async def test_garbage_answer_is_a_transport_error(pool_for: Callable[..., Http1Pool]) -> None:
    server, _, _ = await serve(lambda _: b"SMTP ready\r\n\r\n")
    async with server:
        pool = pool_for(server)
        with pytest.raises(TransportError):
            await pool.request(request(pool))
