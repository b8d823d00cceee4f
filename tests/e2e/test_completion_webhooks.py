"""Completion webhooks end to end: the real API, a delivery worker and the sandbox
providers (subprocesses), and a receiver, a real HTTP server of this test on a free
port. Requests are created, cancelled and fail through the API; the worker's sender
POSTs each final state, signed, retried with the same event id (a short schedule:
``CT_WEBHOOK_RETRY_FIRST_SECONDS``), every attempt listed by the route and the CLI; a
receiver that hangs or refuses never holds a request up."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prefect import get_client
from prefect.client.schemas.actions import WorkPoolUpdate
from sqlalchemy import update
from sqlmodel import col

from campaign_trigger.client import SIGNATURE_HEADER, TriggerClient, verify_signature
from campaign_trigger.deployments.catalog import DELIVERY_POOL
from campaign_trigger.services import admin
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Request
from integration.cli.admin_cli import ok
from integration.client.running_stack import (
    PASSWORD,
    RunningStack,
    SeededTenant,
    eventually,
    running_stack,
    seed_tenant,
)
from support import ManagedProcess, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FLAKY_FAILURES = 2
WEBHOOK_ENV = {
    "CT_SEND_TO_SANDBOX": "true",  # sandbox mode: the receiver's http:// URL is allowed
    "CT_WEBHOOK_RETRY_FIRST_SECONDS": "0.3",
    "CT_WEBHOOK_POLL_SECONDS": "0.2",
    "CT_WEBHOOK_TIMEOUT_SECONDS": "2",
}


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


@dataclass
class Receiver:
    """What the receiver got, per path. ``/flaky/...`` answers 500 twice, then 200;
    ``/hang/...`` answers nothing until ``release`` is set; anything else 200."""

    url: str
    received: list[Received] = field(default_factory=list)
    hanging: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with receiver.lock:
                receiver.received.append(Received(self.path, dict(self.headers), body))
                seen = sum(1 for r in receiver.received if r.path == self.path)
            status = 200
            if self.path.startswith("/flaky/") and seen <= FLAKY_FAILURES:
                status = 500
            if self.path.startswith("/hang/"):
                with receiver.lock:
                    receiver.hanging += 1
                receiver.release.wait(timeout=120)
                with receiver.lock:
                    receiver.hanging -= 1
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    port = free_port()
    found = Receiver(url=f"http://127.0.0.1:{port}")
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(found))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        found.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def stack(prefect_server: ManagedProcess, session_dir: Path) -> Iterator[RunningStack]:
    with running_stack(session_dir, extra_env=WEBHOOK_ENV) as s:
        yield s


@dataclass
class Org:
    tenant: SeededTenant
    owner: dict[str, str]
    member: TriggerClient


@pytest.fixture
def org(stack: RunningStack) -> Iterator[Org]:
    """A seeded tenant with an owner; the owner's auth header and a signed-in member."""
    tenant = seed_tenant()
    owner_email = f"owner-{tenant.org}@example.com"
    with session_scope() as session:
        admin.create_account(
            session=session,
            org_name=tenant.org,
            email=owner_email,
            password=PASSWORD,
            role="owner",
        )
    with TriggerClient(stack.api_url) as owner, TriggerClient(stack.api_url) as member:
        member.sign_in(tenant.member_email, tenant.password)
        yield Org(tenant, {"Authorization": owner.sign_in(owner_email, PASSWORD)}, member)


@contextmanager
def paused_delivery_pool() -> Iterator[None]:
    async def pause(paused: bool) -> None:
        async with get_client() as client:
            await client.update_work_pool(DELIVERY_POOL, WorkPoolUpdate(is_paused=paused))

    asyncio.run(pause(True))
    try:
        yield
    finally:
        asyncio.run(pause(False))


def _register(stack: RunningStack, org: Org, url: str) -> dict[str, str]:
    created = httpx.post(f"{stack.api_url}/api/webhooks", json={"url": url}, headers=org.owner)
    assert created.status_code == 200, created.text
    registered: dict[str, str] = created.json()
    return registered


def _messages(tenant: SeededTenant) -> list[dict[str, Any]]:
    return [
        {"user_id": user, "template_variables": {"first_name": f"N{n}", "order_id": f"O{n}"}}
        for n, user in enumerate(tenant.users)
    ]


def _create(org: Org, *, send_at: datetime | None = None) -> str:
    created = org.member.create(
        org.tenant.campaign_id,
        messages=_messages(org.tenant),
        send_at=send_at or datetime.now(UTC),
    )
    return created.request_id


def _events(receiver: Receiver, path: str, count: int = 1) -> list[Received]:
    def arrived() -> list[Received]:
        got = receiver.at(path)
        assert len(got) >= count, f"{len(got)} of {count} POSTs to {path}"
        return got

    return eventually(arrived, timeout=90, every=0.2)


def _attempts(stack: RunningStack, org: Org, endpoint_id: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{stack.api_url}/api/webhooks/{endpoint_id}/attempts", headers=org.owner)
    assert answer.status_code == 200, answer.text
    attempts: list[dict[str, Any]] = answer.json()["attempts"]
    return attempts


def test_a_processed_request_posts_a_signed_event_with_counts_and_report_links(
    stack: RunningStack, receiver: Receiver, org: Org
) -> None:
    path = f"/ok/{org.tenant.org}"
    endpoint = _register(stack, org, receiver.url + path)
    request_id = _create(org)
    [got] = _events(receiver, path)
    assert verify_signature(got.body, got.headers[SIGNATURE_HEADER], endpoint["secret"])
    assert not verify_signature(got.body, got.headers[SIGNATURE_HEADER], "whsec_not-it")
    assert not verify_signature(got.body + b" ", got.headers[SIGNATURE_HEADER], endpoint["secret"])
    assert got.headers["Content-Type"] == "application/json"
    event = got.event()
    assert event["id"].startswith("evt_")
    assert event["type"] == "request.processed"
    data = event["data"]
    assert {k: data[k] for k in ("request_id", "campaign_id", "state", "counts")} == {
        "request_id": request_id,
        "campaign_id": org.tenant.campaign_id,
        "state": "processed",
        "counts": {"sent": len(org.tenant.users)},
    }
    assert len(data["reports"]) == 1  # one per app, signed like the report route's links
    report = httpx.get(data["reports"][0])
    assert report.status_code == 200
    assert request_id in report.text


def test_a_refused_event_is_retried_with_the_same_id_and_every_attempt_is_listed(
    stack: RunningStack, receiver: Receiver, org: Org
) -> None:
    path = f"/flaky/{org.tenant.org}"
    endpoint = _register(stack, org, receiver.url + path)
    request_id = _create(org)
    posts = _events(receiver, path, count=FLAKY_FAILURES + 1)
    assert len({post.event()["id"] for post in posts}) == 1
    assert all(
        verify_signature(post.body, post.headers[SIGNATURE_HEADER], endpoint["secret"])
        for post in posts
    )
    event_id = posts[0].event()["id"]

    def three_listed() -> list[dict[str, Any]]:
        attempts = _attempts(stack, org, endpoint["id"])
        assert len(attempts) == FLAKY_FAILURES + 1
        return attempts

    attempts = eventually(three_listed, timeout=30, every=0.2)
    assert [(a["status_code"], a["error"]) for a in attempts] == [
        (200, None),
        (500, "HTTP 500"),
        (500, "HTTP 500"),
    ]  # newest first
    assert {(a["event_id"], a["event_type"], a["request_id"]) for a in attempts} == {
        (event_id, "request.processed", request_id)
    }
    assert all(a["duration_ms"] >= 0 and a["attempted_at"] for a in attempts)
    assert len(posts) == FLAKY_FAILURES + 1  # accepted: not sent again
    listed = ok("webhook-attempts", "--org", org.tenant.org, endpoint["id"])
    assert listed.count(event_id) == FLAKY_FAILURES + 1
    assert listed.count("HTTP 500") == FLAKY_FAILURES
    assert "HTTP 200" in listed


def test_a_cancelled_request_posts_a_cancelled_event(
    stack: RunningStack, receiver: Receiver, org: Org
) -> None:
    path = f"/cancelled/{org.tenant.org}"
    endpoint = _register(stack, org, receiver.url + path)
    request_id = _create(org, send_at=datetime.now(UTC) + timedelta(hours=1))
    org.member.cancel(request_id)
    [got] = _events(receiver, path)
    assert verify_signature(got.body, got.headers[SIGNATURE_HEADER], endpoint["secret"])
    event = got.event()
    assert event["type"] == "request.cancelled"
    assert event["data"]["request_id"] == request_id
    assert (event["data"]["state"], event["data"]["counts"], event["data"]["reports"]) == (
        "cancelled",
        {},
        [],
    )


def test_a_failed_request_posts_a_failed_event(
    stack: RunningStack, receiver: Receiver, org: Org
) -> None:
    path = f"/failed/{org.tenant.org}"
    _register(stack, org, receiver.url + path)
    # A request that reaches a worker more than max_lateness_seconds (24 h) after its send
    # time fails: hold the pool while its send time is moved two days back.
    with paused_delivery_pool():
        request_id = _create(org)
        with session_scope() as session:
            session.execute(
                update(Request)
                .where(col(Request.id) == request_id)
                .values(send_at=datetime.now(UTC) - timedelta(days=2))
            )
    [got] = _events(receiver, path)
    event = got.event()
    assert (event["type"], event["data"]["request_id"], event["data"]["state"]) == (
        "request.failed",
        request_id,
        "failed",
    )


def test_a_hanging_or_refusing_receiver_does_not_hold_up_the_request(
    stack: RunningStack, receiver: Receiver, org: Org
) -> None:
    hang, fine = f"/hang/{org.tenant.org}", f"/fine/{org.tenant.org}"
    _register(stack, org, receiver.url + hang)
    refusing = _register(stack, org, f"http://127.0.0.1:{free_port()}/nobody")
    _register(stack, org, receiver.url + fine)
    request_id = _create(org)
    _events(receiver, hang)
    _events(receiver, fine)
    # processed, its report served, while the hanging receiver still holds its POST
    report = eventually(lambda: org.member.report(request_id), timeout=60, retry_on=(Exception,))
    assert len(report.reports) == 1
    assert receiver.hanging >= 1
    refused = eventually(
        lambda: _attempts(stack, org, refusing["id"])[-1], timeout=30, retry_on=(IndexError,)
    )
    assert refused["status_code"] is None
    assert refused["error"].startswith("ConnectError")
    receiver.release.set()
