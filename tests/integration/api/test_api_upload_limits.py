"""Uploads through the real server: a 200 MB CSV in bounded memory (the API process stays
under 400 MB RSS), and the size limit enforced before the body is read."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from api_memory import PeakRss
from api_tenants import Server, Tenant, start_api_server

from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Request

RSS_LIMIT = 400 * 1024 * 1024
ROWS_PER_BLOCK = 100_000


def _big_csv(path: Path, *, min_bytes: int) -> int:
    """A CSV of at least ``min_bytes``; returns its row count."""
    rows = 0
    with path.open("wb") as handle:
        handle.write(b"User,first_name,code\n")
        while handle.tell() < min_bytes:
            block = "".join(
                f"user-{rows + i:09d},Firstname{i % 997},CODE-{i % 7919:06d}\n"
                for i in range(ROWS_PER_BLOCK)
            )
            handle.write(block.encode())
            rows += ROWS_PER_BLOCK
    return rows


@pytest.fixture
def own_api_server(session_dir: Path) -> Iterator[Server]:
    """An API process of its own: its RSS is this upload's, not what the session's shared
    server kept from the suite's earlier calls (its baseline grows with the suite)."""
    server = start_api_server(session_dir, CT_SEND_TO_SANDBOX="false")
    try:
        yield server
    finally:
        server.process.stop()


@pytest.mark.slow
def test_a_200_mb_upload_keeps_the_api_under_400_mb(
    own_api_server: Server, tenant: Tenant, tmp_path: Path
) -> None:
    api_server = own_api_server
    path = tmp_path / "big.csv"
    rows = _big_csv(path, min_bytes=200 * 1024 * 1024)
    size = path.stat().st_size
    before = psutil.Process(api_server.process.pid).memory_info().rss
    with PeakRss(api_server.process.pid) as memory, path.open("rb") as handle:
        started = time.monotonic()
        response = httpx.post(
            f"{api_server.url}/api/campaigns/trigger",
            headers=tenant.auth(),
            timeout=600,
            files={"campaign_id": (None, tenant.started), "file": ("big.csv", handle, "text/csv")},
        )
        elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    request_id = response.json()["request_id"]
    # Five million messages are not for sending: the request leaves the shared outbox, so
    # no worker of a later test spends minutes delivering it.
    cancelled = httpx.put(
        f"{api_server.url}/api/campaigns/request/{request_id}/cancel", headers=tenant.auth()
    )
    assert cancelled.status_code == 200, cancelled.text
    with session_scope() as session:
        request = session.get(Request, request_id)
        assert request is not None
        assert request.message_count == rows
    print(
        f"\n{size / 2**20:.0f} MB, {rows} rows uploaded and validated in {elapsed:.1f}s; "
        f"API RSS {before / 2**20:.0f} MB before, peak {memory.peak / 2**20:.0f} MB "
        f"({memory.samples} samples)"
    )
    assert memory.samples > 10
    assert memory.peak < RSS_LIMIT


@pytest.fixture(scope="module")
def small_limit_server(session_dir: Path) -> Iterator[Server]:
    server = start_api_server(session_dir, CT_MAX_UPLOAD_BYTES="100000")
    try:
        yield server
    finally:
        server.process.stop()


def test_a_declared_length_over_the_limit_is_refused_before_any_body(
    small_limit_server: Server, tenant: Tenant
) -> None:
    url = httpx.URL(small_limit_server.url)
    head = (
        f"POST /api/campaigns/trigger HTTP/1.1\r\nHost: {url.host}\r\n"
        f"Authorization: {tenant.auth()['Authorization']}\r\n"
        "Content-Type: multipart/form-data; boundary=xyz\r\n"
        "Content-Length: 1000000000000\r\n\r\n"
    ).encode()
    with socket.create_connection((url.host, url.port), timeout=10) as sock:
        sock.sendall(head)  # and no body at all
        received = b""
        while b"allowed" not in received:  # the body may come in a second segment
            piece = sock.recv(65536)
            if not piece:
                break
            received += piece
    answer = received.decode()
    assert answer.startswith("HTTP/1.1 413"), answer
    assert '{"error_message":"The file is larger than the 100000 bytes allowed"}' in answer


def test_a_chunked_body_over_the_limit_is_refused_while_streaming(
    small_limit_server: Server, tenant: Tenant
) -> None:
    def body() -> Iterator[bytes]:
        yield (
            b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="u.csv"\r\n'
            b"Content-Type: text/csv\r\n\r\nUser\n"
        )
        for i in range(20):
            yield f"user-{i}\n".encode() * 1000

    response = httpx.post(
        f"{small_limit_server.url}/api/campaigns/trigger",
        content=body(),
        timeout=30,
        headers={**tenant.auth(), "Content-Type": "multipart/form-data; boundary=xyz"},
    )
    assert response.status_code == 413
    assert response.json() == {"error_message": "The file is larger than the 100000 bytes allowed"}
    assert response.headers["x-quota-remaining"].isdigit()
