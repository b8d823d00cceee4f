"""A CSV create cut off at the worst moments, through a real API process and its storage:
SIGKILLed mid-upload (part of the file already in storage), SIGKILLed while the request's
message file is written, SIGKILLed between the two writes that make a request (its
message file complete, the request not yet stored), and the client's connection lost
mid-upload with the API alive.

Nothing is created by a call cut off; the same call again (its Idempotency-Key) creates
the request once; what a killed process left is deleted by the nightly purge once a day
old, and the request's own files are kept. A lost connection leaves no file at all."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from api_tenants import Server, Tenant, start_api_server
from sqlalchemy import text
from sqlmodel import col, func, select

from campaign_trigger.services import housekeeping
from campaign_trigger.store.db import get_engine, session_scope
from campaign_trigger.store.files import ABANDONED_AFTER, Storage
from campaign_trigger.store.models import Request
from support import until

BOUNDARY = "cut-off-boundary"
MIB = 1 << 20

pytestmark = [pytest.mark.slow]


def _body(campaign_id: str, rows: int) -> bytes:
    """A multipart create: the campaign, then a CSV of ``rows`` users (~40 bytes each)."""
    csv = "User,first_name,code\n" + "".join(
        f"cut-user-{n:09d},First{n % 997},CODE-{n % 7919:06d}\n" for n in range(rows)
    )
    return (
        f"--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="campaign_id"\r\n\r\n'
        f"{campaign_id}\r\n"
        f"--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="file"; filename="users.csv"\r\n'
        "Content-Type: text/csv\r\n\r\n"
        f"{csv}\r\n"
        f"--{BOUNDARY}--\r\n"
    ).encode()


def _head(server: Server, tenant: Tenant, *, length: int, key: str) -> bytes:
    url = httpx.URL(server.url)
    return (
        f"POST /api/campaigns/trigger HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
        f"Authorization: {tenant.auth()['Authorization']}\r\n"
        f"Idempotency-Key: {key}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _connect(server: Server) -> socket.socket:
    url = httpx.URL(server.url)
    assert url.port is not None
    return socket.create_connection((url.host, url.port), timeout=30)


def _files(storage: Storage, folder: str) -> dict[str, int]:
    """Key -> size of the files under ``folder``."""
    base = storage.path(folder)
    if not storage.fs.exists(base):
        return {}
    root = storage.root + "/"
    return {
        str(path).removeprefix(root): int(info["size"])
        for path, info in storage.fs.find(base, detail=True).items()
    }


def _complete_message_file(storage_url: str) -> bool:
    """Whether a message file is complete: an Arrow IPC file ends with its magic once
    closed, the moment before its request is stored."""
    for path in Path(storage_url, "messages").glob("*.arrow"):
        with path.open("rb") as handle:
            handle.seek(0, 2)
            if handle.tell() >= 6:
                handle.seek(-6, 2)
                if handle.read() == b"ARROW1":
                    return True
    return False


def _requests_of(tenant: Tenant) -> int:
    with session_scope() as session:
        return session.exec(
            select(func.count()).select_from(Request).where(col(Request.org_id) == tenant.org_id)
        ).one()


@contextmanager
def _no_request_stored() -> Iterator[None]:
    """Hold the database's write lock (SQLite), or the requests table's (PostgreSQL): reads
    go on, and no request is stored until the block ends."""
    engine = get_engine()
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            connection.execute(text(f"LOCK TABLE {Request.__tablename__} IN EXCLUSIVE MODE"))
        try:
            yield
        finally:
            connection.rollback()


@pytest.fixture
def storage_url(tmp_path: Path) -> str:
    """The API's storage, this test's alone: the purge below looks at every file in it."""
    return str(tmp_path / "storage")


@pytest.fixture
def start_api(session_dir: Path, storage_url: str) -> Iterator[Callable[[], Server]]:
    servers: list[Server] = []

    def start() -> Server:
        servers.append(start_api_server(session_dir, CT_STORAGE_URL=storage_url))
        return servers[-1]

    yield start
    for server in servers:
        server.process.stop()


@pytest.mark.parametrize(
    "moment",
    ["mid-upload", "while the message file is written", "the message file complete"],
)
def test_an_api_killed_mid_create_creates_nothing_and_the_same_call_again_creates_it_once(
    start_api: Callable[[], Server], storage_url: str, tenant: Tenant, moment: str
) -> None:
    storage = Storage(storage_url)
    rows = 1_000_000 if moment != "mid-upload" else 100_000  # 40 MB: seconds of checking
    body = _body(tenant.started, rows)
    key = f"cut-off-{moment}-{tenant.org_id}"
    before = _requests_of(tenant)
    server = start_api()

    with _connect(server) as sock, ExitStack() as held:
        if moment == "mid-upload":
            sock.sendall(_head(server, tenant, length=len(body), key=key) + body[: len(body) // 2])
            until(
                lambda: any(size >= MIB for size in _files(storage, "uploads").values()),
                seconds=30,
                what="no part of the upload reached storage",
            )
        elif moment == "while the message file is written":
            sock.sendall(_head(server, tenant, length=len(body), key=key) + body)
            until(
                lambda: bool(_files(storage, "messages")),
                seconds=60,
                what="the request's message file was never begun",
                every=0.002,  # killed as it begins: seconds of checking still ahead
            )
        else:
            sock.sendall(_head(server, tenant, length=len(body), key=key) + body)
            until(
                lambda: bool(_files(storage, "messages")),
                seconds=60,
                what="the request's message file was never begun",
                every=0.002,
            )
            # The request's insert waits on the lock, after its message file is closed:
            # killed between the two writes, whatever the machine's speed (polled for the
            # closed file alone, the kill came after the commit on a busy machine).
            held.enter_context(_no_request_stored())
            until(
                lambda: _complete_message_file(storage_url),
                seconds=120,
                what="the request's message file was never completed",
                every=0.005,
            )
        server.process.kill()  # SIGKILL: no clean-up of any kind

    uploads, messages = _files(storage, "uploads"), _files(storage, "messages")
    assert len(uploads) == 1, uploads
    [(upload, size)] = uploads.items()
    if moment == "mid-upload":
        assert MIB <= size < len(body), size  # a part of the file
        assert messages == {}
    else:
        assert len(messages) == 1, messages  # begun, or whole: killed before storing
    cut_off = upload.removeprefix("uploads/").removesuffix(".csv")
    with session_scope() as session:
        assert session.get(Request, cut_off) is None
    assert _requests_of(tenant) == before  # nothing created

    # The same call again, on the API started anew: created once, replayed after.
    server = start_api()
    answers = [
        httpx.post(
            f"{server.url}/api/campaigns/trigger",
            content=body,
            headers={
                **tenant.auth(),
                "Idempotency-Key": key,
                "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
            },
            timeout=300,
        )
        for _ in range(2)
    ]
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    request_id = answers[0].json()["request_id"]
    assert answers[1].json()["request_id"] == request_id
    assert request_id != cut_off
    assert _requests_of(tenant) == before + 1
    with session_scope() as session:
        request = session.get(Request, request_id)
        assert request is not None
        assert request.message_count == rows
    cancelled = httpx.put(
        f"{server.url}/api/campaigns/request/{request_id}/cancel", headers=tenant.auth()
    )
    assert cancelled.status_code == 200, cancelled.text  # out of the outbox: not for sending

    # The nightly purge: what the killed process left goes once a day old, not before;
    # the request's own files stay (cancelled, but not past the retention period).
    left = {upload, *messages}
    mine = {f"uploads/{request_id}.csv", f"messages/{request_id}.arrow"}
    assert mine <= set(_files(storage, "uploads")) | set(_files(storage, "messages"))

    def purge(now: datetime) -> housekeeping.PurgeSummary:
        with session_scope() as session:
            return housekeeping.delete_expired_files(
                session=session, storage=storage, older_than_days=30, now=now
            )

    assert purge(datetime.now(UTC)).deleted == 0
    later = datetime.now(UTC) + ABANDONED_AFTER + timedelta(hours=1)
    summary = purge(later)
    assert (summary.deleted, summary.abandoned) == (len(left), len(left))
    remaining = set(_files(storage, "uploads")) | set(_files(storage, "messages"))
    assert remaining == mine


def test_a_connection_lost_mid_upload_leaves_no_file_and_creates_nothing(
    start_api: Callable[[], Server], storage_url: str, tenant: Tenant
) -> None:
    storage = Storage(storage_url)
    body = _body(tenant.started, 100_000)
    before = _requests_of(tenant)
    server = start_api()
    with _connect(server) as sock:
        sock.sendall(_head(server, tenant, length=len(body), key="lost") + body[: len(body) // 2])
        until(
            lambda: any(size >= MIB for size in _files(storage, "uploads").values()),
            seconds=30,
            what="no part of the upload reached storage",
        )
    # closed mid-body: the API deletes the part it stored
    until(lambda: not _files(storage, "uploads"), seconds=30, what="the part was left")
    assert _requests_of(tenant) == before
    assert httpx.get(f"{server.url}/openapi.json", timeout=30).status_code == 200
