"""The completion webhooks' sender: drains the webhooks' outbox (``WebhookDelivery``).

Each worker process runs :func:`run_sender` beside its other upkeep loops. A due row is
claimed race-free (its ``next_attempt_at`` moved to the end of a lease, only from the
value read), POSTed with httpx, signed (``client/webhooks.py``), and its attempt
recorded: time, status code or error, duration. A 2xx answer delivers it; anything
else (another status, a timeout, a refused connection) schedules the next try after
``webhook_retry_first_seconds``, doubling up to ``webhook_retry_max_interval_seconds``,
until ``webhook_retry_window_seconds`` after the event (24 h by default), when it is
given up. A sender that dies mid-POST leaves its lease to expire: the event is sent
again, with the same id. Report links are signed at each attempt (valid an hour from
then, as the reports route gives them). Events settled (delivered or given up) are
forgotten with their attempts after ``report_retention_days``, as the reports are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpcore
import httpx
from sqlalchemy import exists, update
from sqlalchemy.orm import aliased
from sqlmodel import col, select
from sqlmodel.sql.expression import Select

from campaign_trigger import __version__
from campaign_trigger.client.webhooks import SIGNATURE_HEADER, signature_header
from campaign_trigger.config import Settings
from campaign_trigger.services import webhooks
from campaign_trigger.services.sealed import SealError, unseal
from campaign_trigger.services.signing import signed_url
from campaign_trigger.store.db import Sessions
from campaign_trigger.store.models import (
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    utcnow,
)

logger = logging.getLogger(__name__)

LEASE_MARGIN_SECONDS = 30.0
PURGE_EVERY_SECONDS = 3600.0
MAX_ERROR_LENGTH = 300


@dataclass(frozen=True)
class Job:
    delivery_id: int
    url: str
    secret: str
    body: bytes


def retry_delay(settings: Settings, attempt_count: int) -> float:
    """The wait after the ``attempt_count``-th failed attempt (1, 2, ...)."""
    delay = settings.webhook_retry_first_seconds * 2 ** min(attempt_count - 1, 40)
    return float(min(delay, settings.webhook_retry_max_interval_seconds))


def event_body(settings: Settings, delivery: WebhookDelivery) -> bytes:
    """The JSON the receiver gets: the event, with freshly signed report links."""
    data: dict[str, Any] = dict(delivery.payload)
    data["reports"] = [
        signed_url(settings=settings, path=f"/files/{key}") for key in data.pop("report_paths", [])
    ]
    event = {
        "id": delivery.event_id,
        "type": delivery.event_type,
        "created_at": delivery.created_at.isoformat().replace("+00:00", "Z"),
        "data": data,
    }
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()


def due_events(*, now: datetime, limit: int) -> Select[int | None, datetime | None]:
    """The ids (and due times) of up to ``limit`` events due at ``now``, soonest first.

    An event waits while an earlier one of its request for its endpoint is still to be
    delivered or tried (leased, or in backoff): a failed request retried in the Prefect UI
    queues request.processed after request.failed, and they must arrive in that order.
    ``ix_webhookdelivery_waiting`` finds those earlier events."""
    earlier = aliased(WebhookDelivery)
    earlier_waiting = (
        select(earlier.id)
        .where(col(earlier.request_id) == col(WebhookDelivery.request_id))
        .where(col(earlier.endpoint_id) == col(WebhookDelivery.endpoint_id))
        .where(col(earlier.id) < col(WebhookDelivery.id))
        .where(col(earlier.next_attempt_at).is_not(None))
    )
    return (
        select(col(WebhookDelivery.id), col(WebhookDelivery.next_attempt_at))
        .where(col(WebhookDelivery.next_attempt_at) <= now)
        .where(~exists(earlier_waiting))
        .order_by(col(WebhookDelivery.next_attempt_at))
        .limit(limit)
    )


def claim_due(*, sessions: Sessions, settings: Settings, limit: int) -> list[Job]:
    """Lease up to ``limit`` due events (no other sender takes them meanwhile), each only
    once the events queued before it for its request and endpoint are settled."""
    now = utcnow()
    lease = now + timedelta(seconds=settings.webhook_timeout_seconds + LEASE_MARGIN_SECONDS)
    with sessions() as session:
        due = session.exec(due_events(now=now, limit=limit)).all()
        if not due:  # most rounds: nothing to lease, so no second read and no commit here
            return []
        claimed: list[int] = []
        for delivery_id, seen in due:
            result = session.execute(
                update(WebhookDelivery)
                .where(col(WebhookDelivery.id) == delivery_id)
                .where(col(WebhookDelivery.next_attempt_at) == seen)
                .values(next_attempt_at=lease)
            )
            if getattr(result, "rowcount", 0) and delivery_id is not None:
                claimed.append(delivery_id)
        session.commit()
        rows = session.exec(
            select(WebhookDelivery, WebhookEndpoint)
            .join(WebhookEndpoint, col(WebhookEndpoint.id) == col(WebhookDelivery.endpoint_id))
            .where(col(WebhookDelivery.id).in_(claimed))
        ).all()
        jobs = []
        for delivery, endpoint in rows:
            try:
                secret = unseal(
                    settings, endpoint.sealed_secret, context=webhooks.secret_context(endpoint.id)
                ).decode()
            except SealError as exc:
                logger.error("webhook %s: %s", endpoint.id, exc)
                continue  # tried again when its lease ends, should the secret come back
            assert delivery.id is not None
            jobs.append(Job(delivery.id, endpoint.url, secret, event_body(settings, delivery)))
        return jobs


def _describe(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:MAX_ERROR_LENGTH]


class Refused(httpcore.ConnectError):
    """The host resolves to a private address, or to none: not connected."""


async def public_addresses(host: str, port: int) -> list[str]:
    """The addresses to connect to for ``host``, in the resolver's order, if every
    address it resolves to now is public; else :class:`Refused` says why. A name that
    does not resolve now is refused too: the attempt fails and is retried."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise Refused(f"refused: {host} could not be resolved ({_describe(exc)})") from None
    if not found:
        raise Refused(f"refused: {host} could not be resolved")
    for *_, address in found:
        if webhooks.is_private(str(address[0])):
            raise Refused(f"refused: {host} resolves to {address[0]}, not a public address")
    return list(dict.fromkeys(str(address[0]) for *_, address in found))


class PublicOnly(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, connecting only to public addresses: each connection
    resolves its host once, checks what it found (:func:`public_addresses`) and tries
    the addresses checked, one after the other (a host whose first address does not
    answer, IPv6 on a network without it say, is reached on the next). Checked at each
    connection, not only at registration: a public name can be pointed at a private
    address later. Checked and connected in one step: a name re-pointed between a check
    and the connection's own lookup (DNS rebinding, a name answering a public address
    then a private one) reached the private one. TLS still names the host (SNI,
    certificate), as the URL gives it."""

    def __init__(self) -> None:
        self._backend = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await public_addresses(host, port)
        # each address but the last gets its share of the connect timeout: one that drops
        # packets silently would otherwise take all of it and leave the next untried
        share = None if timeout is None else timeout / len(addresses)
        for address in addresses[:-1]:
            with contextlib.suppress(httpcore.ConnectError, httpcore.ConnectTimeout):
                return await self._connect(address, port, share, local_address, socket_options)
        return await self._connect(addresses[-1], port, timeout, local_address, socket_options)

    async def _connect(
        self,
        address: str,
        port: int,
        timeout: float | None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None,
        socket_options: Iterable[Any] | None,
    ) -> httpcore.AsyncNetworkStream:
        return await self._backend.connect_tcp(
            address,
            port,
            timeout=timeout,
            local_address=local_address,
            socket_options=socket_options,
        )

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class PublicOnlyTransport(httpx.AsyncHTTPTransport):
    """httpx's transport on a pool whose connections are :class:`PublicOnly`'s (httpx
    takes no network backend: its pool is made again, with httpx's default limits: any
    option given to ``super().__init__`` is lost with it). No proxy from the
    environment: a proxy would resolve the name itself (``SSL_CERT_FILE`` and
    ``SSL_CERT_DIR`` still count)."""

    def __init__(self) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=True),
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=PublicOnly(),
        )


def transport_for(settings: Settings) -> httpx.AsyncBaseTransport | None:
    """The sender's transport: public addresses only, unless sandbox mode or
    ``webhook_allow_private_addresses`` lets a receiver be on the service's network
    (None: httpx's own)."""
    return None if webhooks.private_allowed(settings) else PublicOnlyTransport()


async def attempt(
    client: httpx.AsyncClient, settings: Settings, job: Job
) -> tuple[int | None, str | None, int]:
    """POST the event once: (status code, error, duration in ms). A host the client's
    transport refuses (:class:`Refused`) is not called; the attempt records why."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": f"campaign-trigger-webhooks/{__version__}",
        SIGNATURE_HEADER: signature_header(job.body, job.secret),
    }
    started = time.monotonic()
    status: int | None = None
    error: str | None = None
    try:
        async with asyncio.timeout(settings.webhook_timeout_seconds):
            response = await client.post(job.url, content=job.body, headers=headers)
        status = response.status_code
        if not 200 <= status < 300:
            error = f"HTTP {status}"
    except TimeoutError:
        error = f"no answer in {settings.webhook_timeout_seconds:g} s"
    except httpx.HTTPError as exc:
        refused = exc.__cause__
        error = str(refused)[:MAX_ERROR_LENGTH] if isinstance(refused, Refused) else _describe(exc)
    return status, error, int((time.monotonic() - started) * 1000)


def record_attempt(
    *,
    sessions: Sessions,
    settings: Settings,
    delivery_id: int,
    attempted_at: datetime,
    status_code: int | None,
    error: str | None,
    duration_ms: int,
) -> None:
    """Write the attempt; deliver the event, or schedule its next try (or give it up)."""
    with sessions() as session:
        delivery = session.get(WebhookDelivery, delivery_id)
        if delivery is None:  # its endpoint was removed meanwhile
            return
        session.add(
            WebhookAttempt(
                delivery_id=delivery_id,
                attempted_at=attempted_at,
                status_code=status_code,
                error=error,
                duration_ms=duration_ms,
            )
        )
        delivery.attempt_count += 1
        if error is None:
            delivery.delivered_at = utcnow()
            delivery.next_attempt_at = None
        else:
            after = utcnow() + timedelta(seconds=retry_delay(settings, delivery.attempt_count))
            window_end = delivery.created_at + timedelta(
                seconds=settings.webhook_retry_window_seconds
            )
            delivery.next_attempt_at = after if after <= window_end else None
            if delivery.next_attempt_at is None:
                logger.warning(
                    "webhook event %s given up after %d attempts (last: %s)",
                    delivery.event_id,
                    delivery.attempt_count,
                    error,
                )
        session.add(delivery)


async def _send(
    client: httpx.AsyncClient, *, sessions: Sessions, settings: Settings, job: Job
) -> None:
    attempted_at = utcnow()
    status, error, duration = await attempt(client, settings, job)
    try:
        await asyncio.to_thread(
            record_attempt,
            sessions=sessions,
            settings=settings,
            delivery_id=job.delivery_id,
            attempted_at=attempted_at,
            status_code=status,
            error=error,
            duration_ms=duration,
        )
    except Exception as exc:  # the lease ends and the event goes again, same id
        logger.warning("webhook attempt of delivery %d not recorded: %r", job.delivery_id, exc)


def purge(*, sessions: Sessions, settings: Settings) -> int:
    """Forget the events settled more than the retention period ago."""
    before = utcnow() - timedelta(days=settings.report_retention_days)
    with sessions() as session:
        return webhooks.purge_settled(session=session, before=before)


async def run_sender(
    *,
    sessions: Sessions,
    settings: Settings,
    stop: asyncio.Event,
    transport: httpx.AsyncBaseTransport | None = None,
) -> None:
    """Send due events, ``webhook_concurrency`` at a time, until ``stop``."""
    in_flight: set[asyncio.Task[None]] = set()
    # httpx's own limits (5 s each by default) would cut off a receiver that answers in
    # the documented time: each follows the setting, which also bounds the whole POST.
    timeout = httpx.Timeout(settings.webhook_timeout_seconds)
    async with httpx.AsyncClient(
        transport=transport or transport_for(settings), follow_redirects=False, timeout=timeout
    ) as client:
        try:
            purged_at = -PURGE_EVERY_SECONDS
            while not stop.is_set():
                if time.monotonic() - purged_at >= PURGE_EVERY_SECONDS:
                    purged_at = time.monotonic()
                    try:
                        await asyncio.to_thread(purge, sessions=sessions, settings=settings)
                    except Exception as exc:  # tried again in an hour
                        logger.warning("webhook purge: %r", exc)
                free = settings.webhook_concurrency - len(in_flight)
                jobs: list[Job] = []
                if free > 0:
                    try:
                        jobs = await asyncio.to_thread(
                            claim_due, sessions=sessions, settings=settings, limit=free
                        )
                    except Exception as exc:  # database busy or away: next round
                        logger.warning("webhook sender: %r", exc)
                for job in jobs:
                    task = asyncio.create_task(
                        _send(client, sessions=sessions, settings=settings, job=job)
                    )
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                if not jobs:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), settings.webhook_poll_seconds)
        finally:
            for task in in_flight:
                task.cancel()  # their leases end, and another round sends them again
            await asyncio.gather(*in_flight, return_exceptions=True)
