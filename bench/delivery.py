"""Delivery benchmark: messages/s through ``send_many`` vs a bare aiohttp blast.

Starts a fast local responder in a child process (plain asyncio on uvloop: HTTP/1.1
keep-alive, and HTTP/2 cleartext with prior knowledge via h2), then in this process:

1. bare aiohttp: N prebuilt POSTs over ``--connections`` keep-alive connections;
2. ``FcmProvider.send_many``: the same N messages (payload build, OAuth header, answer
   mapping, result objects included), same concurrency;
3. ``ApnsProvider.send_many``: the same N messages over HTTP/2 (h2c), for reference.

Prints msgs/s for each and the ratio of ``send_many`` to the bare blast (target: FCM
≥ 10,000 msgs/s and ≥ 0.7x the bare blast, DESIGN §6). Usage:
``.venv/bin/python bench/delivery.py [-n 50000] [--connections 64] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import multiprocessing
import os
import re
import statistics
import time
from typing import Any, NamedTuple

import aiohttp
import h2.config
import h2.connection
import h2.events
import h2.settings

from harness import free_port, result

TARGET_RATE = 10_000.0
TARGET_RATIO = 0.7
FCM_ANSWER = (
    b'{"name": "projects/bench/messages/0:1", "access_token": "ya29.bench", "expires_in": 3599}'
)
HTTP11_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=UTF-8\r\n"
    b"Content-Length: " + str(len(FCM_ANSWER)).encode() + b"\r\n\r\n" + FCM_ANSWER
)
CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Http11OrH2c(asyncio.Protocol):
    """Answers every request with 200: HTTP/1.1 keep-alive, or h2c when it sees the preface."""

    def __init__(self) -> None:
        self.buffer = b""
        self.h2: h2.connection.H2Connection | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport  # a uvloop transport is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        if self.h2 is not None:
            self._h2_data(data)
            return
        self.buffer += data
        if self.buffer.startswith(H2_PREFACE[: len(self.buffer)]) and len(self.buffer) < 24:
            return
        if self.buffer.startswith(H2_PREFACE):
            config = h2.config.H2Configuration(
                client_side=False,
                header_encoding=None,
                validate_inbound_headers=False,
                normalize_inbound_headers=False,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
            self.h2 = h2.connection.H2Connection(config)
            encoder = self.h2.encoder
            encoder.encode = functools.partial(type(encoder).encode, encoder, huffman=False)  # type: ignore[method-assign]
            self.h2.initiate_connection()
            self.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000})
            buffered, self.buffer = self.buffer, b""
            self._h2_data(buffered)
            return
        answers = 0
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            match = CONTENT_LENGTH.search(self.buffer, 0, end + 2)
            length = int(match.group(1)) if match else 0
            if len(self.buffer) < end + 4 + length:
                break
            self.buffer = self.buffer[end + 4 + length :]
            answers += 1
        if answers:
            self.transport.write(HTTP11_ANSWER * answers)

    def _h2_data(self, data: bytes) -> None:
        assert self.h2 is not None
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.h2.send_headers(
                    event.stream_id, [(b":status", b"200"), (b"apns-id", b"x")], end_stream=True
                )
        self.transport.write(self.h2.data_to_send())


def _serve(port: int, ready: Any) -> None:
    import uvloop

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(
            Http11OrH2c, "127.0.0.1", port, backlog=1024
        )
        ready.set()
        await server.serve_forever()

    uvloop.run(serve())


class Figure(NamedTuple):
    """One timed run: wall-clock throughput and this process's CPU seconds per message."""

    rate: float
    cpu_per_message: float


def bodies(n: int) -> list[bytes]:
    """What FcmProvider sends for :func:`messages`, prebuilt."""
    return [
        json.dumps(
            {
                "message": {
                    "token": f"bench-{i}",
                    "notification": {"title": f"Hi {i}", "body": "Your order shipped"},
                    "data": {"request_id": "r", "campaign_id": "c"},
                    "android": {"priority": "high"},
                }
            },
            separators=(",", ":"),
        ).encode()
        for i in range(n)
    ]


async def bare_aiohttp(url: str, n: int, connections: int) -> Figure:
    """The reference: prebuilt bodies, no mapping, just POST and read."""
    payloads = bodies(n)
    headers = {
        "Authorization": "Bearer ya29.bench",
        "Content-Type": "application/json; charset=UTF-8",
    }
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        work = iter(payloads)

        async def worker() -> None:
            for body in work:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(connections)))
        return Figure(n / (time.perf_counter() - started), (time.process_time() - cpu) / n)


def messages(n: int) -> list[Any]:
    from campaign_trigger.delivery.base import PushMessage

    data = {"request_id": "r", "campaign_id": "c"}
    return [PushMessage(i, f"bench-{i}", f"Hi {i}", "Your order shipped", data) for i in range(n)]


async def through_provider(kind: str, base: str, n: int, connections: int) -> Figure:
    """The same messages through our provider's ``send_many``."""
    from campaign_trigger.config import Settings
    from campaign_trigger.delivery.apns import ApnsProvider
    from campaign_trigger.delivery.credentials import apns_credentials, fcm_credentials
    from campaign_trigger.delivery.fcm import FcmProvider

    settings = Settings(fcm_base_url=base, fcm_token_uri=f"{base}/token", apns_base_url=base)
    provider: FcmProvider | ApnsProvider
    if kind == "fcm":
        provider = FcmProvider(fcm_credentials(settings), concurrency=connections)
    else:
        provider = ApnsProvider(apns_credentials(settings), concurrency=max(connections, 256))
    batch = messages(n)
    try:
        await provider.send_many(batch[:100])  # warm up: token, connections
        started, cpu = time.perf_counter(), time.process_time()
        results = await provider.send_many(batch)
        figure = Figure(n / (time.perf_counter() - started), (time.process_time() - cpu) / n)
    finally:
        await provider.aclose()
    failed = sum(1 for r in results if r.error_message)
    assert failed == 0, f"{failed} messages failed"
    return figure


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-n", type=int, default=50_000)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    port = free_port()
    ready = multiprocessing.Event()
    responder = multiprocessing.Process(target=_serve, args=(port, ready), daemon=True)
    responder.start()
    ready.wait(10)
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/v1/projects/bench/messages:send"
    names = ("bare aiohttp (HTTP/1.1)", "FcmProvider.send_many", "ApnsProvider.send_many (h2c)")
    figures: dict[str, list[Figure]] = {name: [] for name in names}
    load_before = os.getloadavg()[0]
    try:
        for _ in range(args.rounds):  # interleaved, so load changes hit every contender
            figures[names[0]].append(asyncio.run(bare_aiohttp(url, args.n, args.connections)))
            figures[names[1]].append(
                asyncio.run(through_provider("fcm", base, args.n, args.connections))
            )
            figures[names[2]].append(
                asyncio.run(through_provider("apns", base, args.n, args.connections))
            )
    finally:
        responder.terminate()
    print(
        f"delivery benchmark: {args.n:,} messages x {args.rounds} rounds, {args.connections} "
        f"connections, responder in its own process (uvloop); {os.cpu_count()} CPUs, "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    bare = figures[names[0]]
    ratios: dict[str, float] = {}
    for name in names:
        runs = figures[name]
        rate = statistics.median(f.rate for f in runs)
        ratio = statistics.median(f.rate / b.rate for f, b in zip(runs, bare, strict=True))
        ratios[name] = ratio
        cpu = statistics.median(f.cpu_per_message for f in runs)
        cpu_ratio = statistics.median(b.cpu_per_message for b in bare) / cpu
        print(
            f"  {name:30s} {rate:8,.0f} msgs/s  ratio to bare {ratio:.2f} (median of rounds) | "
            f"client CPU {cpu * 1e6:5.0f} us/msg, ratio {cpu_ratio:.2f} | "
            f"rounds {', '.join(f'{f.rate:,.0f}' for f in runs)}"
        )
    fcm = statistics.median(f.rate for f in figures[names[1]])
    result(
        "delivery",
        "FcmProvider.send_many, one process",
        figure=f"{fcm:,.0f} msgs/s",
        reference=f"{statistics.median(f.rate for f in bare):,.0f} msgs/s (bare aiohttp blast)",
        ratio=ratios[names[1]],
        target=f">= {TARGET_RATE:,.0f} msgs/s and >= {TARGET_RATIO}x the bare blast",
        met=fcm >= TARGET_RATE and ratios[names[1]] >= TARGET_RATIO,
    )


if __name__ == "__main__":
    main()
