"""Completion webhooks on a real SQLite session: which URLs may be registered, the
secret kept sealed, one event per endpoint queued with a request's final state (and
only when it changes), and the retry schedule of the sender's bookkeeping."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest
from sqlmodel import Session, col, select

from campaign_trigger.config import Settings
from campaign_trigger.errors import InvalidInput
from campaign_trigger.services import lifecycle, reports, webhooks
from campaign_trigger.services.request_states import set_state
from campaign_trigger.services.sealed import unseal
from campaign_trigger.services.webhook_sender import (
    Job,
    attempt,
    claim_due,
    due_events,
    record_attempt,
    retry_delay,
    transport_for,
)
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.migrate import upgrade
from campaign_trigger.store.models import (
    Request,
    RequestState,
    WebhookAttempt,
    WebhookDelivery,
)
from service_support import Org, add_json_request, add_outcomes, make_org


def _deliveries(session: Session, request_id: str) -> list[WebhookDelivery]:
    return list(
        session.exec(select(WebhookDelivery).where(WebhookDelivery.request_id == request_id))
    )


def test_https_is_required_outside_sandbox_mode(settings: Settings) -> None:
    with pytest.raises(InvalidInput, match="https://"):
        webhooks.check_url(settings=settings, url="http://example.com/hook")
    assert webhooks.check_url(settings=settings, url=" https://example.com/h ") == (
        "https://example.com/h"
    )
    sandbox = settings.model_copy(update={"send_to_sandbox": True})
    assert webhooks.check_url(settings=sandbox, url="http://127.0.0.1:9/h")


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/h",
        "https://10.1.2.3/h",
        "https://192.168.0.10:8443/h",
        "https://169.254.169.254/latest/meta-data",
        "https://100.64.0.1/h",
        "https://0.0.0.0/h",
        "https://224.0.0.1/h",
        "https://[::1]/h",
        "https://[fd00::1]/h",
        "https://[fe80::1]/h",
        "https://[::ffff:127.0.0.1]/h",
        "https://localhost/h",
        "https://LOCALHOST./h",
    ],
)
def test_a_private_address_is_refused_outside_sandbox_mode(settings: Settings, url: str) -> None:
    with pytest.raises(InvalidInput, match="private, loopback, link-local or reserved"):
        webhooks.check_url(settings=settings, url=url)
    allowed = settings.model_copy(update={"webhook_allow_private_addresses": True})
    assert webhooks.check_url(settings=allowed, url=url) == url
    sandbox = settings.model_copy(update={"send_to_sandbox": True})
    assert webhooks.check_url(settings=sandbox, url=url) == url


def test_public_addresses_and_names_are_accepted(settings: Settings) -> None:
    for url in ("https://93.184.216.34/h", "https://[2606:4700::1111]/h", "https://hooks.a.io/"):
        assert webhooks.check_url(settings=settings, url=url) == url


@asynccontextmanager
async def _receiver() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A plain HTTP receiver on 127.0.0.1: its port, and the requests it got (their
    first lines), each answered 200."""
    got: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        got.append(head.split(b"\r\n", 1)[0])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1], got


async def test_a_name_resolving_to_a_private_address_is_not_called(settings: Settings) -> None:
    async with _receiver() as (port, got):
        job = Job(delivery_id=1, url=f"http://localhost:{port}/hook", secret="whsec_x", body=b"{}")
        async with httpx.AsyncClient(transport=transport_for(settings)) as client:
            status, error, _ = await attempt(client, settings, job)
        assert (status, got) == (None, [])
        assert error is not None
        assert error.startswith("refused: localhost resolves to ")
        allowed = settings.model_copy(update={"webhook_allow_private_addresses": True})
        async with httpx.AsyncClient(transport=transport_for(allowed)) as client:
            assert (await attempt(client, allowed, job))[:2] == (200, None)
        assert got == [b"POST /hook HTTP/1.1"]


async def test_a_name_re_pointed_at_a_private_address_after_the_check_is_not_called(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DNS rebinding: the name answers a public address to the check, then (TTL 0) the
    # service's own address to the connection's lookup.
    answers: list[str] = []

    async def rebinding(host: str, port: int, **_: object) -> list[tuple[Any, ...]]:
        address = "93.184.216.34" if not answers else "127.0.0.1"
        answers.append(address)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", rebinding)
    quick = settings.model_copy(update={"webhook_timeout_seconds": 1.0})
    async with _receiver() as (port, got):
        job = Job(delivery_id=1, url=f"http://rebind.test:{port}/h", secret="whsec_x", body=b"{}")
        async with httpx.AsyncClient(transport=transport_for(quick)) as client:
            status, error, _ = await attempt(client, quick, job)
    assert (status, got) == (None, [])  # the POST went to the address checked, or nowhere
    assert error is not None
    assert answers == ["93.184.216.34"]  # one lookup: checked and connected in one step


@pytest.mark.parametrize(
    "url",
    [
        "example.com/hook",
        "ftp://example.com/x",
        "https://",
        "https://h:99999/",
        "https://e.com/a b",
        "https://e.com/\x00",
        "https://\ud800.com/",
        "x" * 3000,
    ],
)
def test_a_url_that_is_no_absolute_http_url_is_refused(settings: Settings, url: str) -> None:
    sandbox = settings.model_copy(update={"send_to_sandbox": True})
    with pytest.raises(InvalidInput, match="absolute URL"):
        webhooks.check_url(settings=sandbox, url=url)


def test_the_secret_is_shown_once_and_stored_only_sealed(
    session: Session, settings: Settings, org: Org
) -> None:
    registered = webhooks.register(
        session=session, settings=settings, org_id=org.org_id, url="https://example.com/h"
    )
    session.commit()
    endpoint = registered.endpoint
    assert registered.secret.startswith("whsec_")
    assert registered.secret not in endpoint.sealed_secret
    opened = unseal(settings, endpoint.sealed_secret, context=webhooks.secret_context(endpoint.id))
    assert opened.decode() == registered.secret


def test_an_organisation_has_a_bounded_number_of_endpoints(
    session: Session, settings: Settings, org: Org
) -> None:
    for n in range(webhooks.MAX_ENDPOINTS):
        webhooks.register(
            session=session, settings=settings, org_id=org.org_id, url=f"https://e.com/{n}"
        )
    with pytest.raises(InvalidInput, match="at most"):
        webhooks.register(
            session=session, settings=settings, org_id=org.org_id, url="https://e.com/x"
        )


def test_a_final_state_queues_one_event_per_endpoint_once(
    session: Session, settings: Settings, org: Org
) -> None:
    for path in ("a", "b"):
        webhooks.register(
            session=session, settings=settings, org_id=org.org_id, url=f"https://e.com/{path}"
        )
    request_id = add_json_request(session, org)
    add_outcomes(session, org, request_id, ["", "", "No device for user"])
    assert set_state(session=session, request_id=request_id, state=RequestState.running)
    assert _deliveries(session, request_id) == []
    assert set_state(session=session, request_id=request_id, state=RequestState.failed)
    assert not set_state(session=session, request_id=request_id, state=RequestState.failed)
    session.commit()
    queued = _deliveries(session, request_id)
    assert len(queued) == 2
    assert len({d.event_id for d in queued}) == 1
    assert {d.event_type for d in queued} == {"request.failed"}
    assert queued[0].payload == {
        "request_id": request_id,
        "campaign_id": org.campaign_id,
        "state": "failed",
        "message_count": 3,
        "counts": {"sent": 2, "No device for user": 1},
        "report_paths": [],
    }
    assert all(d.next_attempt_at is not None for d in queued)


def test_processed_and_cancelled_in_the_outbox_queue_their_events(
    session: Session, settings: Settings, org: Org
) -> None:
    webhooks.register(session=session, settings=settings, org_id=org.org_id, url="https://e.com")
    processed = add_json_request(session, org)
    reports.mark_processed(session=session, request_id=processed, report_paths=["reports/x.csv"])
    reports.mark_processed(session=session, request_id=processed, report_paths=["reports/x.csv"])
    session.commit()
    [event] = _deliveries(session, processed)
    assert (event.event_type, event.payload["report_paths"]) == (
        "request.processed",
        ["reports/x.csv"],
    )
    cancelled = add_json_request(session, org)
    assert lifecycle._cancel_in_outbox(session, cancelled)
    [event] = _deliveries(session, cancelled)
    assert (event.event_type, event.payload["state"]) == ("request.cancelled", "cancelled")


@pytest.mark.parametrize("then", list(RequestState))
@pytest.mark.parametrize("settled", [RequestState.canceled, RequestState.processed])
def test_a_cancelled_or_processed_request_stays_so_with_its_one_event(
    session: Session, settings: Settings, org: Org, settled: RequestState, then: RequestState
) -> None:
    """Cancelled: a stopped run's Crashed and crash hook, its late report or a claim come
    after. Processed: a run of it taken over or retried (running, then processed again),
    a cancel or a failure after its report."""
    webhooks.register(session=session, settings=settings, org_id=org.org_id, url="https://e.com")
    request_id = add_json_request(session, org)
    assert set_state(session=session, request_id=request_id, state=RequestState.running)
    assert set_state(session=session, request_id=request_id, state=settled)
    assert not set_state(session=session, request_id=request_id, state=then)
    session.commit()
    assert session.get(Request, request_id).state == settled  # type: ignore[union-attr]
    events = [d.event_type for d in _deliveries(session, request_id)]
    assert events == [webhooks.EVENT_TYPES[settled]]


def test_only_the_requests_organisation_gets_its_events(
    session: Session, settings: Settings, org: Org
) -> None:
    other = make_org(session)
    webhooks.register(session=session, settings=settings, org_id=other.org_id, url="https://o.com")
    request_id = add_json_request(session, org)
    set_state(session=session, request_id=request_id, state=RequestState.canceled)
    session.commit()
    assert _deliveries(session, request_id) == []


def test_retries_double_up_to_their_cap() -> None:
    settings = Settings(webhook_retry_first_seconds=10, webhook_retry_max_interval_seconds=3600)
    assert [retry_delay(settings, n) for n in (1, 2, 3, 4, 9, 10, 200)] == [
        10, 20, 40, 80, 2560, 3600, 3600
    ]  # fmt: skip


def test_a_failed_attempt_is_recorded_and_retried_until_the_window_closes(
    session: Session, settings: Settings, org: Org, database: str
) -> None:
    webhooks.register(session=session, settings=settings, org_id=org.org_id, url="https://e.com")
    request_id = add_json_request(session, org)
    set_state(session=session, request_id=request_id, state=RequestState.failed)
    session.commit()
    [delivery] = _deliveries(session, request_id)
    assert delivery.id is not None
    assert webhooks.waiting_events(session=session) == 1

    @contextmanager
    def sessions() -> Iterator[Session]:
        with Session(session.get_bind(), expire_on_commit=False) as own:
            yield own
            own.commit()

    short = settings.model_copy(
        update={"webhook_retry_first_seconds": 60, "webhook_retry_window_seconds": 100}
    )
    for status, error in ((500, "HTTP 500"), (None, "ConnectError: refused")):
        record_attempt(
            sessions=sessions,
            settings=short,
            delivery_id=delivery.id,
            attempted_at=datetime.now(UTC),
            status_code=status,
            error=error,
            duration_ms=5,
        )
        session.refresh(delivery)
        if status == 500:  # retried 60 s later, within the window
            assert delivery.next_attempt_at is not None
            assert delivery.next_attempt_at > datetime.now(UTC) + timedelta(seconds=50)
    assert delivery.next_attempt_at is None  # 120 s later: past the 100 s window
    assert webhooks.waiting_events(session=session) == 0  # given up
    assert (delivery.attempt_count, delivery.delivered_at) == (2, None)
    attempts = session.exec(select(WebhookAttempt).order_by(col(WebhookAttempt.id))).all()
    assert [(a.status_code, a.error) for a in attempts] == [
        (500, "HTTP 500"),
        (None, "ConnectError: refused"),
    ]
    views = webhooks.attempts(session=session, org_id=org.org_id, endpoint_id=delivery.endpoint_id)
    assert [v.status_code for v in views] == [None, 500]  # newest first
    webhooks.remove(session=session, org_id=org.org_id, endpoint_id=delivery.endpoint_id)
    session.commit()
    assert session.exec(select(WebhookAttempt)).all() == []
    assert _deliveries(session, request_id) == []


def _check_later_event_waits(
    session: Session, settings: Settings, org: Org, *, failed_ends: str
) -> None:
    """A failed request retried in the Prefect UI ends processed: request.processed is
    not sent while request.failed, queued before it, is in backoff (it arrived first, and
    the stale failure last); other requests' events are not held back."""
    webhooks.register(session=session, settings=settings, org_id=org.org_id, url="https://e.com")
    request_id, other_id = add_json_request(session, org), add_json_request(session, org)
    assert set_state(session=session, request_id=request_id, state=RequestState.failed)
    session.commit()
    [failed] = _deliveries(session, request_id)
    assert failed.id is not None

    @contextmanager
    def sessions() -> Iterator[Session]:
        with Session(session.get_bind(), expire_on_commit=False) as own:
            yield own
            own.commit()

    def claimed() -> list[int]:
        jobs = claim_due(sessions=sessions, settings=settings, limit=16)
        return [job.delivery_id for job in jobs]

    def answer(error: str | None, *, window: float = 3600) -> None:
        assert failed.id is not None
        record_attempt(
            sessions=sessions,
            settings=settings.model_copy(update={"webhook_retry_window_seconds": window}),
            delivery_id=failed.id,
            attempted_at=datetime.now(UTC),
            status_code=None if error else 200,
            error=error,
            duration_ms=5,
        )

    assert claimed() == [failed.id]
    answer("HTTP 503")  # in backoff
    assert set_state(session=session, request_id=request_id, state=RequestState.running)
    reports.mark_processed(session=session, request_id=request_id, report_paths=[])
    set_state(session=session, request_id=other_id, state=RequestState.failed)
    session.commit()
    processed = next(d for d in _deliveries(session, request_id) if d.id != failed.id)
    [other] = _deliveries(session, other_id)
    assert processed.event_type == "request.processed"
    assert claimed() == [other.id]  # not request.processed: request.failed is still to go

    session.refresh(failed)
    failed.next_attempt_at = datetime.now(UTC) - timedelta(seconds=1)  # its retry comes due
    session.add(failed)
    session.commit()
    assert claimed() == [failed.id]  # both due: the earlier alone
    assert claimed() == []  # leased: the later still waits
    if failed_ends == "delivered":
        answer(None)
    else:
        answer("HTTP 503", window=0)  # past its window
    session.refresh(failed)
    assert failed.next_attempt_at is None
    assert claimed() == [processed.id]


@pytest.mark.parametrize("failed_ends", ["delivered", "given up"])
def test_a_requests_later_event_waits_for_its_earlier_one_to_settle(
    session: Session, settings: Settings, org: Org, failed_ends: str
) -> None:
    _check_later_event_waits(session, settings, org, failed_ends=failed_ends)


@pytest.mark.postgres
@pytest.mark.parametrize("failed_ends", ["delivered", "given up"])
def test_a_requests_later_event_waits_for_its_earlier_one_on_postgres(
    postgres_url: str, settings: Settings, failed_ends: str
) -> None:
    upgrade(postgres_url)
    with Session(engine_for(postgres_url), expire_on_commit=False) as session:
        _check_later_event_waits(session, settings, make_org(session), failed_ends=failed_ends)


def test_the_claim_finds_earlier_events_by_the_index_of_those_waiting(tmp_path: Path) -> None:
    """Not by reading every event of the endpoint for each due one (SQLite did)."""
    url = f"sqlite:///{tmp_path / 'plan.sqlite'}"
    upgrade(url)
    statement = due_events(now=datetime.now(UTC), limit=16).compile(engine_for(url))
    with engine_for(url).connect() as connection:
        plan = connection.exec_driver_sql(
            f"EXPLAIN QUERY PLAN {statement}", (None,) * len(statement.positiontup or [])
        ).all()
    details = [row[-1] for row in plan]
    assert any("ix_webhookdelivery_due" in detail for detail in details), details
    assert any("ix_webhookdelivery_waiting" in detail for detail in details), details


def test_settled_events_are_forgotten_after_the_retention_period(
    session: Session, settings: Settings, org: Org
) -> None:
    webhooks.register(session=session, settings=settings, org_id=org.org_id, url="https://e.com")
    old, pending, recent = (add_json_request(session, org) for _ in range(3))
    for request_id in (old, pending, recent):
        set_state(session=session, request_id=request_id, state=RequestState.failed)
    session.flush()
    rows = {d.request_id: d for d in session.exec(select(WebhookDelivery))}
    long_ago = datetime.now(UTC) - timedelta(days=40)
    rows[old].created_at, rows[old].next_attempt_at = long_ago, None
    rows[pending].created_at = long_ago  # still to be tried: kept
    rows[recent].next_attempt_at = None
    old_id = rows[old].id
    assert old_id is not None
    session.add(
        WebhookAttempt(delivery_id=old_id, attempted_at=long_ago, status_code=200, duration_ms=1)
    )
    session.commit()
    before = datetime.now(UTC) - timedelta(days=30)
    assert webhooks.purge_settled(session=session, before=before) == 1
    session.commit()
    assert {d.request_id for d in session.exec(select(WebhookDelivery))} == {pending, recent}
    assert session.exec(select(WebhookAttempt)).all() == []


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b:1::a9fe:a9fe",  # a network's own NAT64 prefix
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "2002:0a00:0001::1",  # 6to4 of 10.0.0.1
        "::a9fe:a9fe",  # IPv4-compatible 169.254.169.254
        "::ffff:a9fe:a9fe",  # IPv4-mapped 169.254.169.254
    ],
)
def test_an_ipv6_address_carrying_a_private_ipv4_one_is_private(
    settings: Settings, address: str
) -> None:
    assert webhooks.is_private(address)
    with pytest.raises(InvalidInput, match="private, loopback, link-local or reserved"):
        webhooks.check_url(settings=settings, url=f"https://[{address}]/h")


@pytest.mark.parametrize(
    "address", ["64:ff9b::808:808", "2002:808:808::1", "2606:4700::1111", "8.8.8.8"]
)
def test_an_ipv6_address_carrying_a_public_ipv4_one_is_public(address: str) -> None:
    assert not webhooks.is_private(address)


def _public_name_at(monkeypatch: pytest.MonkeyPatch, *addresses: str) -> None:
    """Every name resolves to ``addresses``, in that order, and every address counts as
    public (so that local receivers stand for public ones)."""

    async def resolve(host: str, port: int, **_: object) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", resolve)
    monkeypatch.setattr(webhooks, "is_private", lambda address: False)


async def test_a_host_whose_first_address_does_not_answer_is_reached_on_the_next(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as httpx's own lookup does: every address the name has, in turn (here 127.0.0.2
    # refuses the connection)
    _public_name_at(monkeypatch, "127.0.0.2", "127.0.0.1")
    async with _receiver() as (port, got):
        job = Job(delivery_id=1, url=f"http://two.test:{port}/h", secret="whsec_x", body=b"{}")
        async with httpx.AsyncClient(transport=transport_for(settings)) as client:
            assert (await attempt(client, settings, job))[:2] == (200, None)
    assert got == [b"POST /h HTTP/1.1"]


async def test_a_first_address_that_never_answers_leaves_time_for_the_next(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 127.0.0.3 stands for an address that drops packets: its connection waits out the
    # timeout it is given (the kernel would refuse it at once)
    _public_name_at(monkeypatch, "127.0.0.3", "127.0.0.1")
    real = httpcore.AnyIOBackend.connect_tcp

    async def silent_first(
        backend: httpcore.AnyIOBackend, host: str, port: int, **options: Any
    ) -> httpcore.AsyncNetworkStream:
        if host == "127.0.0.3":
            await asyncio.sleep(options["timeout"])
            raise httpcore.ConnectTimeout("timed out")
        return await real(backend, host, port, **options)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", silent_first)
    quick = settings.model_copy(update={"webhook_timeout_seconds": 2.0})
    async with _receiver() as (port, got):
        job = Job(delivery_id=1, url=f"http://two.test:{port}/h", secret="whsec_x", body=b"{}")
        timeout = httpx.Timeout(quick.webhook_timeout_seconds)
        async with httpx.AsyncClient(transport=transport_for(quick), timeout=timeout) as client:
            assert (await attempt(client, quick, job))[:2] == (200, None)
    assert got == [b"POST /h HTTP/1.1"]


async def test_a_name_that_does_not_resolve_is_not_called_its_attempt_failed(
    settings: Settings,
) -> None:
    job = Job(delivery_id=1, url="https://no-such-host.invalid/hook", secret="whsec_x", body=b"{}")
    async with httpx.AsyncClient(transport=transport_for(settings)) as client:
        status, error, _ = await attempt(client, settings, job)
    assert status is None
    assert error is not None
    assert error.startswith("refused: no-such-host.invalid could not be resolved")
